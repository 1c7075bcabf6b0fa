"""Prefill and decode throughput of fak's float32 path vs transformers ``generate()``,
same weights, same prompt, same run. Greedy; the generated tokens are compared.

Also measured, to explain the decode figure: fak's torch decode path (what runs
off-CPU), and one bare pass of matrix-vector products over every weight with
torch (MKL) and with numpy (OpenBLAS) — the floor of a float32 decode step —
beside a plain read of the same bytes (``sum``).

    python bench/decode.py [--json PATH] [--prefill-tokens 1024] [--prompt-tokens 256] [--new-tokens 128]
"""

from __future__ import annotations

import random
import time

import torch
from common import best_of, log, parser, report, target

from fak.kernel.generate import SamplingParams, generate
from fak.kernel.loader import load_model
from fak.kernel.model import Llama
from fak.kernel.weights import default_model_path

WORDS = ["agent", "tool", "result", "cache", "policy", "kernel", "token", "model", "span", "audit", "reference", "session", "tenant", "the", "a", "of", "and", "to", "in", "is", "for", "on", "with", "as", "by", "at", "from", "that", "this", "it", "be", "are", "was", "were", "has", "have", "search", "web", "page", "email", "file", "shell", "output", "request", "response", "server", "client", "data", "value", "error"]


def prompt_ids(tokenizer, n: int, seed: int = 7) -> list[int]:  # noqa: ANN001
    rng = random.Random(seed)
    body = " ".join(rng.choice(WORDS) for _ in range(n * 2))
    text = tokenizer.render([{"role": "user", "content": "Summarise this tool output:\n" + body}], True)
    ids = tokenizer.encode(text)
    return ids[: n - 5] + tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n")


def bare_passes(model: Llama, repeat: int) -> dict[str, float]:
    """Seconds for one matrix-vector product with every weight matrix (no norms, no
    attention), through torch and through numpy, and for a plain read of those bytes."""
    mats = [t for lw in model.w.layers for t in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down)] + [model.w.lm_head]
    vecs = {n: torch.randn(n) for n in {m.shape[1] for m in mats}}
    np_mats = [m.numpy() for m in mats]
    np_vecs = {n: v.numpy() for n, v in vecs.items()}
    flat = torch.cat([m.reshape(-1) for m in mats])
    t_torch, _ = best_of(lambda: [torch.mv(m, vecs[m.shape[1]]) for m in mats], repeat * 5)
    t_numpy, _ = best_of(lambda: [m @ np_vecs[m.shape[1]] for m in np_mats], repeat * 5)
    t_read, _ = best_of(lambda: float(flat.sum()), repeat * 5)
    return {"bytes": float(flat.numel() * flat.element_size()), "torch_mv": t_torch, "numpy_mv": t_numpy, "read": t_read}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--prefill-tokens", type=int, default=1024)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)

    log("loading fak model ...")
    lm = load_model()
    model, tok = lm.model, lm.tokenizer
    log("loading transformers peer from the same GGUF ...")
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()

    long_ids = prompt_ids(tok, args.prefill_tokens)
    short_ids = prompt_ids(tok, args.prompt_tokens)

    def fak_prefill() -> int:
        cache = model.new_cache(len(long_ids) + 8)
        return int(model.forward(long_ids, cache).argmax())

    torch_decode = Llama(model.cfg, model.w, model_id=model.model_id, decode="torch")

    def fak_generate(n: int, m: Llama = model) -> list[int]:
        cache = m.new_cache(len(short_ids) + n + 8)
        return list(generate(m, cache, short_ids, SamplingParams(max_tokens=n, min_tokens=n, stop_token_ids=eos)))

    # both sides run exactly n greedy steps with end-of-sequence masked until then
    # (transformers' min_new_tokens, fak's min_tokens), so the tokens must agree
    eos = frozenset({tok.eos_token_id})

    def hf_generate(ids: list[int], n: int) -> list[int]:
        x = torch.tensor([ids])
        with torch.inference_mode():
            out = hf.generate(
                x, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.eos_token_id
            )
        return out[0, len(ids) :].tolist()

    log("warming up ...")
    fak_prefill(), fak_generate(4), hf_generate(short_ids, 4)

    log("prefill ...")
    t_fak_prefill, _ = best_of(fak_prefill, args.repeat)
    t_hf_prefill, _ = best_of(lambda: hf_generate(long_ids, 1), args.repeat)

    log("decode ...")
    t_fak_first, _ = best_of(lambda: fak_generate(1), args.repeat)
    t_fak_all, fak_tokens = best_of(lambda: fak_generate(args.new_tokens), args.repeat)
    t_hf_first, _ = best_of(lambda: hf_generate(short_ids, 1), args.repeat)
    t_hf_all, hf_tokens = best_of(lambda: hf_generate(short_ids, args.new_tokens), args.repeat)
    t_torch_first, _ = best_of(lambda: fak_generate(1, torch_decode), args.repeat)
    t_torch_all, torch_tokens = best_of(lambda: fak_generate(args.new_tokens, torch_decode), args.repeat)
    log("bare matrix-vector passes ...")
    bare = bare_passes(model, args.repeat)
    steps = args.new_tokens - 1
    fak_decode = steps / (t_fak_all - t_fak_first)
    hf_decode = steps / (t_hf_all - t_hf_first)
    torch_decode_tps = steps / (t_torch_all - t_torch_first)
    fak_prefill_tps = len(long_ids) / t_fak_prefill
    hf_prefill_tps = len(long_ids) / t_hf_prefill
    same = fak_tokens == hf_tokens
    first_diff = next((i for i, (a, b) in enumerate(zip(fak_tokens, hf_tokens, strict=False)) if a != b), None)

    gap = None
    if first_diff is not None:
        # how close the two candidates were where greedy decoding first parted
        cache = model.new_cache()
        logits = model.forward(short_ids + fak_tokens[:first_diff], cache)[-1]
        gap = float(logits[fak_tokens[first_diff]] - logits[hf_tokens[first_diff]])

    results = {
        "model": str(path.name),
        "dtype": "float32",
        "prefill_tokens": len(long_ids),
        "prompt_tokens": len(short_ids),
        "new_tokens": args.new_tokens,
        "fak_prefill_tok_s": fak_prefill_tps,
        "hf_prefill_tok_s": hf_prefill_tps,
        "prefill_ratio": fak_prefill_tps / hf_prefill_tps,
        "fak_decode_tok_s": fak_decode,
        "hf_decode_tok_s": hf_decode,
        "decode_ratio": fak_decode / hf_decode,
        "fak_decode_backend": model.decode,
        "fak_torch_decode_tok_s": torch_decode_tps,
        "torch_decode_identical_tokens": torch_tokens == hf_tokens,
        "weight_bytes_per_token": bare["bytes"],
        "bare_mv_torch_tok_s": 1 / bare["torch_mv"],
        "bare_mv_numpy_tok_s": 1 / bare["numpy_mv"],
        "sgemv_torch_gb_s": bare["bytes"] / bare["torch_mv"] / 1e9,
        "sgemv_numpy_gb_s": bare["bytes"] / bare["numpy_mv"] / 1e9,
        "read_gb_s": bare["bytes"] / bare["read"] / 1e9,
        "fak_decode_share_of_bare_numpy_pass": fak_decode * bare["numpy_mv"],
        "hf_attn_implementation": hf.config._attn_implementation,
        "identical_output_tokens": same,
        "first_token_difference": first_diff,
        "logit_gap_at_first_difference": gap,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"{'':<10}{'prefill tok/s':>15}{'decode tok/s':>15}")
    print(f"{'fak':<10}{fak_prefill_tps:>15.1f}{fak_decode:>15.2f}")
    print(f"{'hf':<10}{hf_prefill_tps:>15.1f}{hf_decode:>15.2f}")
    print(f"{'ratio':<10}{results['prefill_ratio']:>15.3f}{results['decode_ratio']:>15.3f}")
    print(f"fak decode through torch (the off-CPU path): {torch_decode_tps:.2f} tok/s")
    print(f"bare matrix-vector pass over {bare['bytes'] / 1e6:.0f} MB of weights: torch {1 / bare['torch_mv']:.1f} "
          f"tok/s ({results['sgemv_torch_gb_s']:.1f} GB/s), numpy {1 / bare['numpy_mv']:.1f} tok/s "
          f"({results['sgemv_numpy_gb_s']:.1f} GB/s); plain read {results['read_gb_s']:.1f} GB/s")
    print(f"identical greedy tokens: {same} (first difference: {first_diff}, fak's logit gap between "
          f"its choice and transformers' there: {gap})")
    targets = [
        target("decode_ratio_vs_transformers", results["decode_ratio"], 1.25, ">="),
        target("prefill_ratio_vs_transformers", results["prefill_ratio"], 1.0, ">="),
        target("identical_output_tokens", float(same), 1.0, ">="),
    ]
    report("decode", results, targets, args.json)


if __name__ == "__main__":
    main()
