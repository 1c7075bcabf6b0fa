"""``fak generate`` and ``fak info``: the model alone, without the Kernel (``fak demo`` is the
façade's, in ``fak.kernel.cli``)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from fak.cli_options import MODEL_HELP, add_config

# the handlers import the model (torch) and the settings when a command runs: every ``fak``
# invocation imports this module to register its subcommands, and most never load a model
if TYPE_CHECKING:
    from pathlib import Path

    from fak.kernel.model.loader import LoadedModel
    from fak.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("generate", help="chat with the model (streams to the terminal)")
    g.add_argument("--prompt", required=True, help="user message")
    g.add_argument("--system", default=None, help="system message (default: the model's own)")
    g.add_argument("--model", default=None, metavar="PATH", help=MODEL_HELP)
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--raw", action="store_true", help="send --prompt as is, without the chat template")
    g.add_argument("--device", default=None, help=DEVICE_HELP)
    add_config(g)
    g.set_defaults(handler=_generate)

    i = sub.add_parser("info", help="model, weight format, each tensor type and what computes it, KV bytes per token")
    i.add_argument("--model", default=None, metavar="PATH", help=MODEL_HELP)
    i.add_argument("--device", default=None, help=DEVICE_HELP)
    i.add_argument("--weights", default=None, choices=("gguf", "float16", "int8", "bfloat16", "float32"),
                   help="weight format (default: FAK_WEIGHTS, else the serving default: gguf where a C compiler "
                        "and AVX2 are)")
    add_config(i)
    i.set_defaults(handler=_info)


DEVICE_HELP = "cpu, cuda or cuda:N (default: the settings' device, FAK_DEVICE, else cpu; float32 weights on a GPU)"


def _settings() -> Settings:
    from fak.settings import Settings

    return Settings.load()


def _path(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _load(path: str | None, device: str = "cpu", weights: str = "float32") -> LoadedModel:
    from fak.kernel.model.loader import load_model

    return load_model(path, device=device, weight_format=weights,
                      progress=lambda m: print(f"[fak] {m}", file=sys.stderr, flush=True))


def _generate(args: argparse.Namespace) -> int:
    from fak.kernel.model.generate import SamplingParams, generate

    settings = _settings()
    lm = _load(args.model or _path(settings.model_path), args.device or settings.device)
    tok = lm.tokenizer
    if args.raw:
        ids = tok.encode(args.prompt)
    else:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}
        ]
        ids = tok.encode(tok.render(messages, add_generation_prompt=True))
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        stop_token_ids=frozenset(tok.stop_token_ids),
    )
    cache = lm.model.new_cache(len(ids) + args.max_tokens)
    t0 = time.perf_counter()
    n = 0

    def counted() -> Iterator[int]:
        nonlocal n
        for t in generate(lm.model, cache, ids, params):
            n += 1
            yield t

    for piece in tok.stream_text(counted()):
        sys.stdout.write(piece)
        sys.stdout.flush()
    dt = time.perf_counter() - t0
    print(f"\n[fak] {len(ids)} prompt + {n} generated tokens in {dt:.2f}s", file=sys.stderr)
    return 0


def _info(args: argparse.Namespace) -> int:
    from fak.kernel.model import blockdot

    settings = _settings()
    device = args.device or settings.device
    weights = args.weights or settings.weights or (blockdot.default_weights() if device == "cpu" else "float32")
    lm = _load(args.model or _path(settings.model_path), device, weights)
    cfg = lm.model.cfg
    rows = {
        "model": cfg.name,
        "architecture": cfg.arch + (f" (sliding window {cfg.sliding_window})" if cfg.sliding_window else ""),
        "model_id": lm.model_id,
        "source": str(lm.source),
        "parameters": f"{lm.model.w.parameters():,}",
        "layers / heads / kv heads / head dim": f"{cfg.num_layers} / {cfg.num_heads} / {cfg.num_kv_heads} / {cfg.head_dim}",
        "vocab": cfg.vocab_size,
        "context": cfg.max_position_embeddings,
        "rope": f"theta={cfg.rope_theta:g} scaling={cfg.rope_scaling.kind}",
        "dtype / device": f"{lm.model.dtype} / {lm.model.device}",
        "weights": lm.model.weight_format,
        "attention": lm.model.attention,
        "decode": "C block step (csrc/blockdot.c: one call a step, every layer)" if lm.model.batches_decode else
                  {"blas": "blas (numpy's OpenBLAS; threads: OPENBLAS_NUM_THREADS)", "torch": "torch"}[lm.model.decode],
        "KV bytes per token (K, Kraw, V + ids, positions)": lm.model.new_cache(1).bytes_per_token,
        "weight cache": str(settings.cache_dir / "weights"),
        "tokenizer": lm.tokenizer.digest,
    }
    if lm.model.weight_format == "gguf":
        rows["gguf kernel units"] = blockdot.kernel_units()
    if lm.source.is_file():  # a GGUF file: each tensor type, and what computes it in this format
        tensors = blockdot.gguf_blocks(lm.source, cfg)
        for type_name, names in sorted(blockdot.tensors_by_type(tensors).items()):
            rows[f"{type_name} tensors ({len(names)})"] = blockdot.computed_by(type_name, lm.model.weight_format)
    width = max(len(k) for k in rows)
    for k, v in rows.items():
        print(f"{k:<{width}}  {v}")
    return 0
