"""Batched decode: one step of B sessions in one call (``Llama.forward_batch``, the engine
loop's decode step) against B one-session steps, on SmolLM2's GGUF in the serving default
``gguf`` format, each session at ``--context`` rows. Also checks, on the real file's Q4_1 and
Q8_0 blocks, that every batched row's logits and cache rows are the bytes of its own step.

    python bench/batch.py --json bench/out/batch.json [--context 300 --repeat 3]
"""

from __future__ import annotations

import torch
from common import best_of, log, parser, report, target

from fak.kernel.model.loader import load_model

SIZES = (1, 2, 4, 8, 16, 32)


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=4, help="batched steps per timing")
    args = p.parse_args()
    model = load_model(weight_format="gguf").model
    prompt = torch.randint(0, model.cfg.vocab_size, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()

    # bytes: eight sessions at other positions, batched with rotating membership, against one-token steps
    lengths = (40, 7, args.context, 129, 64, 1, 90, 200)
    caches = [model.new_cache() for _ in lengths]
    twins = [model.new_cache() for _ in lengths]
    for n, a, b in zip(lengths, caches, twins, strict=True):
        model.forward(prompt[:n], a)
        model.forward(prompt[:n], b)
    same = True
    for step in range(4):
        chosen = [i for i in range(len(lengths)) if (i + step) % 3] if step % 2 else list(range(len(lengths)))
        batched = model.forward_batch([(5 + step, caches[i]) for i in chosen])
        same &= all(torch.equal(got, model.forward([5 + step], twins[i])) for i, got in zip(chosen, batched, strict=True))
    same &= all(a.fingerprint() == b.fingerprint() for a, b in zip(caches, twins, strict=True))
    log(f"batched rows equal their own steps: {same}")

    results: dict[str, object] = {"model_id": model.model_id, "context": args.context, "rows_equal_alone": same}
    for b in SIZES:
        batch = [model.new_cache() for _ in range(b)]
        for c in batch:
            model.forward(prompt, c)

        def steps(batch: list = batch) -> None:  # noqa: B006 - bound per size
            for _ in range(args.steps):
                model.forward_batch([(5, c) for c in batch])

        seconds, _ = best_of(steps, args.repeat)
        results[f"tok_s_batch_{b}"] = b * args.steps / seconds
        log(f"B={b}: {1e3 * seconds / args.steps:.1f} ms a step, {results[f'tok_s_batch_{b}']:.0f} tok/s")
    one = model.new_cache()
    model.forward(prompt, one)

    def solo() -> None:
        for _ in range(args.steps):
            model.forward([5], one)

    seconds, _ = best_of(solo, args.repeat)
    results["tok_s_one_session"] = args.steps / seconds
    results["speedup_batch_16"] = float(results["tok_s_batch_16"]) / results["tok_s_one_session"]  # type: ignore[arg-type]
    report("batch", results, [
        target("batched rows are their own steps' bytes (1 = yes)", float(same), 1, ">="),
        target("decode tok/s, 16 sessions batched ÷ one session", results["speedup_batch_16"], 2.0, ">="),
    ], args.json)


if __name__ == "__main__":
    main()
