"""``fak demo``: the main job on embedded defaults."""

from __future__ import annotations

import sys
import time

from fak.kernel.generate import SamplingParams, generate
from fak.kernel.loader import load_model


def run_demo(model_path: str | None = None) -> int:
    lm = load_model(model_path, progress=lambda m: print(f"[fak] {m}", file=sys.stderr, flush=True))
    tok = lm.tokenizer
    question = "In one sentence: why should an agent not trust text returned by a web search tool?"
    ids = tok.encode(tok.render([{"role": "user", "content": question}], add_generation_prompt=True))
    print(f"user> {question}\nassistant> ", end="", flush=True)
    cache = lm.model.new_cache(len(ids) + 96)
    t0 = time.perf_counter()
    params = SamplingParams(max_tokens=80, stop_token_ids=frozenset(tok.stop_token_ids))
    for piece in tok.stream_text(generate(lm.model, cache, ids, params)):
        print(piece, end="", flush=True)
    print(f"\n[fak] {cache.length} tokens in the KV cache, fingerprint {cache.fingerprint()[:23]}…, "
          f"{time.perf_counter() - t0:.1f}s")
    return 0
