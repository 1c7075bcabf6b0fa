"""Radix-tree prefix cache on SmolLM2: time to first token hit vs miss, memory
vs a full-prefix-copy-per-node design, hit rate on a multi-agent trace, and the share of the
agents' common prefix a real server serves from the prefix cache.

    python bench/prefix.py [--json PATH] [--prefix-tokens 2000] [--repeat 3] [--agents 5] [--turns 20]
                           [--requests 8] [--sections ttft,memory,trace,common]

* TTFT: a ~2,000-token shared prefix (system prompt + tool schemas) plus a
  short question. Miss = a fresh session prefills the prefix then the
  question (the same chunks a session makes); hit = match + copy the cached
  prefix + prefill the question. First token = argmax of the last logits;
  hit and miss logits are compared (bit-exact expected).
* Memory: 8 sessions branching from one 1,000-token prefix with 200 unique
  tokens each; bytes held by the tree vs Σ over the same nodes of
  (prefix length × bytes per row), i.e. every node holding its whole prefix.
* Trace: 5 agents × 20 turns, one tenant, shared system prompt and tools;
  each turn resends the whole history (stateless API), looks up the longest
  cached prefix, prefills the rest, appends a reply and inserts it back.
* Common prefix (issue 45, item 3): ``--requests`` requests of bench/serve.py's shape
  (streaming chat: a fixed system prompt, a question, an assistant tool call, its ~335-token
  tool result, a question; ``tests/support/agent_prefix.py``) through a real HTTP server on
  the serving default weights, with the request's ``tools`` (two function schemas, as agent
  frameworks send on every request) and without, sent one after another and all at once (a
  burst: no request has inserted anything when the others look up). A request's shared
  tokens are its longest common token prefix with any other request's rendered prompt (read
  from a reference server without a prefix cache); the rate is the tokens served from the
  prefix cache over the shared tokens of every request but one. Every answer (text,
  logprobs, KV fingerprint) is compared with the reference server's (bit-exact expected).
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import ROOT, best_of, log, parser, report, target

sys.path.insert(0, str(ROOT / "tests"))
from support import agent_prefix as wl  # noqa: E402 - tests/ is a fixture folder

from fak.kernel.kv.prefix_cache import PrefixCache, namespace
from fak.kernel.model.loader import load_model
from fak.keys import tenant_salt

WORDS = ["agent", "tool", "result", "cache", "policy", "kernel", "token", "model", "span", "audit", "reference", "session", "tenant", "search", "web", "page", "email", "file", "shell", "output", "request", "response", "server", "client", "data", "value", "error", "string", "number", "boolean", "array", "object", "required", "description", "parameters", "returns", "query", "limit", "offset", "path", "content", "encoding", "timeout"]


def text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def tool_schemas(rng: random.Random, n_tools: int) -> str:
    tools = []
    for i in range(n_tools):
        params = ", ".join(f'"{rng.choice(WORDS)}_{j}": {{"type": "string", "description": "{text(rng, 8)}"}}' for j in range(4))
        tools.append(f'{{"name": "tool_{i}", "description": "{text(rng, 12)}", "parameters": {{{params}}}}}')
    return "\n".join(tools)


def shared_prefix(tok, n_tokens: int, seed: int = 1) -> list[int]:  # noqa: ANN001
    """System prompt + tool schemas + the user header, cut to ``n_tokens``."""
    rng = random.Random(seed)
    system = "You are a careful agent. Use the tools below.\n" + tool_schemas(rng, 200)
    ids = tok.encode(tok.render([{"role": "system", "content": system}]))
    header = tok.encode("<|im_start|>user\n")
    return ids[: n_tokens - len(header) - 1] + tok.encode("<|im_end|>\n") + header


def ttft(model, tok, prefix_tokens: int, repeat: int) -> dict:  # noqa: ANN001
    prefix = shared_prefix(tok, prefix_tokens)
    q0 = tok.encode("Which tool lists the files in a folder?<|im_end|>\n<|im_start|>assistant\n")
    q1 = tok.encode("Summarise the shell tool in one line.<|im_end|>\n<|im_start|>assistant\n")
    pc = PrefixCache()
    ns = namespace(tenant_salt(b"\x01" * 32, "bench-tenant"), model.model_id)
    warm = model.new_cache(len(prefix) + len(q0) + 8)
    model.forward(prefix, warm)
    model.forward(q0, warm)
    pc.insert(ns, prefix + q0, warm)  # an earlier session asked another question
    del warm

    def miss() -> torch.Tensor:
        cache = model.new_cache(len(prefix) + len(q1) + 8)
        model.forward(prefix, cache)
        return model.forward(q1, cache)

    def hit() -> torch.Tensor:
        with pc.match(ns, prefix + q1) as m:
            cache = model.new_cache(m.length + len(q1) + 8)
            m.copy_into(cache)
        return model.forward((prefix + q1)[m.length :], cache)

    log(f"TTFT: prefix {len(prefix)} tokens, question {len(q1)} tokens ...")
    hit()  # first lookup splits the edge at the end of the prefix
    t_hit, l_hit = best_of(hit, repeat * 3)
    t_miss, l_miss = best_of(miss, repeat)
    with pc.match(ns, prefix + q1) as m:
        matched = m.length
    return {
        "prefix_tokens": len(prefix),
        "question_tokens": len(q1),
        "matched_tokens": matched,
        "ttft_miss_s": t_miss,
        "ttft_hit_s": t_hit,
        "hit_over_miss": t_hit / t_miss,
        "same_first_token": int(l_hit.argmax()) == int(l_miss.argmax()),
        "logits_max_abs_diff": float((l_hit - l_miss).abs().max()),
    }


def memory(model, tok, shared_tokens: int = 1000, unique_tokens: int = 200, sessions: int = 8) -> dict:  # noqa: ANN001
    rng = random.Random(3)
    prefix = shared_prefix(tok, shared_tokens, seed=2)
    pc = PrefixCache()
    ns = namespace(tenant_salt(b"\x02" * 32, "bench-tenant"), model.model_id)
    first = model.new_cache(shared_tokens + 8)
    model.forward(prefix, first)
    pc.insert(ns, prefix, first)
    del first
    log(f"memory: {sessions} sessions × ({shared_tokens} shared + {unique_tokens} unique) tokens ...")
    for _ in range(sessions):
        own = tok.encode(text(rng, unique_tokens * 2))[:unique_tokens]
        with pc.match(ns, prefix + own) as m:
            cache = model.new_cache(shared_tokens + unique_tokens + 8)
            m.copy_into(cache)
        model.forward((prefix + own)[m.length :], cache)
        pc.insert(ns, prefix + own, cache)
    st = pc.stats
    full = pc.full_copy_bytes()
    per_session = sessions * (shared_tokens + unique_tokens) * model.new_cache(1).bytes_per_token
    return {
        "tree_bytes": st.bytes,
        "tree_nodes": st.nodes,
        "full_copy_per_node_bytes": full,
        "tree_over_full_copy": st.bytes / full,
        "copy_per_session_bytes": per_session,
        "tree_over_copy_per_session": st.bytes / per_session,
    }


def trace(model, tok, agents: int, turns: int) -> dict:  # noqa: ANN001
    rng = random.Random(4)
    system = "You are one of several cooperating agents. Tools:\n" + tool_schemas(random.Random(5), 8)
    pc = PrefixCache()
    ns = namespace(tenant_salt(b"\x03" * 32, "bench-tenant"), model.model_id)
    histories = [
        [{"role": "system", "content": system}, {"role": "user", "content": f"Agent {a}: " + text(rng, 30)}]
        for a in range(agents)
    ]
    prompt_tokens = prefilled = 0
    log(f"trace: {agents} agents × {turns} turns ...")
    t0 = time.perf_counter()
    for turn in range(turns):
        for a in range(agents):
            h = histories[a]
            prompt = tok.encode(tok.render(h, add_generation_prompt=True))
            with pc.match(ns, prompt[:-1]) as m:  # the last token is always prefilled (it gives the logits)
                cache = model.new_cache(len(prompt) + 64)
                m.copy_into(cache)
            prompt_tokens += len(prompt)
            prefilled += len(prompt) - m.length
            reply = f"Calling tool_{rng.randrange(8)} with " + text(rng, 12)
            reply_ids = tok.encode(reply + "<|im_end|>\n")
            # the rest of the prompt, then the reply (one call stands in for decoding it)
            model.forward(prompt[m.length :] + reply_ids, cache)
            pc.insert(ns, prompt + reply_ids, cache)
            h.append({"role": "assistant", "content": reply})
            kind = "tool" if turn % 2 == 0 else "user"
            h.append({"role": "user", "content": f"[{kind}] " + text(rng, 25)})
    elapsed = time.perf_counter() - t0
    st = pc.stats
    return {
        "agents": agents,
        "turns": turns,
        "prompt_tokens": prompt_tokens,
        "prefilled_tokens": prefilled,
        "hit_rate": (prompt_tokens - prefilled) / prompt_tokens,
        "tree_bytes": st.bytes,
        "tree_nodes": st.nodes,
        "wall_s": elapsed,
    }


def common(requests: int) -> dict:
    """The common-prefix workload through real servers (module docstring)."""
    from fak.kernel.model.blockdot import default_weights

    weights = default_weights()
    log(f"common prefix: loading SmolLM2 ({weights} weights, the serving default) ...")
    lm = load_model(weight_format=weights)
    out: dict = {"weights": weights, "requests": requests}
    with tempfile.TemporaryDirectory(prefix="fak-bench-prefix-") as tmp:
        for tools in (True, False):
            name = "tools" if tools else "no_tools"
            log(f"common prefix, {name}: reference server without a prefix cache ...")
            ref = wl.reference(Path(tmp) / f"ref-{name}", lm, tools, requests)
            for burst in (False, True):
                mode = "burst" if burst else "sequential"
                log(f"common prefix, {name}, {mode} ...")
                with wl.server(Path(tmp) / f"{name}-{mode}", lm, prefix_cache=True) as live:
                    t0 = time.perf_counter()
                    answers = wl.run(live, tools, requests, burst=burst)
                    wall = time.perf_counter() - t0
                    st = live.kernel.prefix.stats_for(live.kernel.namespace(wl.TENANT))
                served = wl.served(answers)
                out[f"{name}_{mode}"] = {
                    "prompt_tokens": [len(p) for p in ref.prompts],
                    "shared_tokens": ref.shared,
                    "shared_whole_segment_tokens": ref.whole,
                    "served_tokens": served,
                    "served_over_shared": wl.rate(served, ref.shared),
                    "served_over_shared_whole_segments": wl.rate(served, ref.whole) if sum(ref.whole) else 0.0,
                    "computed_tokens": st.computed_tokens,
                    "waits": st.waits,
                    "bit_exact": wl.same_answers(answers, ref.answers),
                    "wall_s": wall,
                }
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--agents", type=int, default=5)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--requests", type=int, default=8, help="requests per run of the common-prefix workload")
    ap.add_argument("--sections", default="ttft,memory,trace,common")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    torch.manual_seed(0)
    results: dict = {}
    targets = []
    if sections & {"ttft", "memory", "trace"}:
        log("loading SmolLM2 ...")
        lm = load_model()
        model, tok = lm.model, lm.tokenizer
    if "ttft" in sections:
        results["ttft"] = r_ttft = ttft(model, tok, args.prefix_tokens, args.repeat)
        targets.append(target("ttft_hit_over_miss", r_ttft["hit_over_miss"], 0.10, "<="))
        print_ttft(r_ttft)
    if "memory" in sections:
        results["memory"] = r_mem = memory(model, tok)
        targets.append(target("tree_bytes_over_full_prefix_copy", r_mem["tree_over_full_copy"], 0.35, "<="))
        print_memory(r_mem)
    if "trace" in sections:
        results["trace"] = r_trace = trace(model, tok, args.agents, args.turns)
        print_trace(r_trace, args)
    if "common" in sections:
        results["common_prefix"] = r_common = common(args.requests)
        print_common(r_common)
        for mode in ("sequential", "burst"):
            r = r_common[f"tools_{mode}"]
            targets.append(target(f"common_prefix_served_over_shared_tools_{mode}", r["served_over_shared"], 0.9, ">="))
        targets.append(target("common_prefix_bit_exact", float(all(
            r_common[f"{t}_{m}"]["bit_exact"] for t in ("tools", "no_tools") for m in ("sequential", "burst"))), 1.0,
            ">="))
    report("prefix", results, targets, args.json)


def print_ttft(r_ttft: dict) -> None:
    print("\nTTFT (best of runs)")
    print(f"  miss  {r_ttft['ttft_miss_s'] * 1e3:9.1f} ms   ({r_ttft['prefix_tokens']} + {r_ttft['question_tokens']} tokens prefilled)")
    print(f"  hit   {r_ttft['ttft_hit_s'] * 1e3:9.1f} ms   ({r_ttft['matched_tokens']} tokens from the tree)")
    print(f"  same first token: {r_ttft['same_first_token']}, max|Δlogits| = {r_ttft['logits_max_abs_diff']:.3g}")


def print_memory(r_mem: dict) -> None:
    print("\nMemory (8 sessions branching from a 1,000-token prefix, 200 unique tokens each)")
    print(f"  tree                    {r_mem['tree_bytes'] / 2**20:9.1f} MiB in {r_mem['tree_nodes']} nodes")
    print(f"  full prefix per node    {r_mem['full_copy_per_node_bytes'] / 2**20:9.1f} MiB")
    print(f"  full copy per session   {r_mem['copy_per_session_bytes'] / 2**20:9.1f} MiB")


def print_trace(r_trace: dict, args) -> None:  # noqa: ANN001
    print(f"\nTrace ({args.agents} agents × {args.turns} turns)")
    print(f"  prompt tokens {r_trace['prompt_tokens']}, prefilled {r_trace['prefilled_tokens']}, "
          f"hit rate {r_trace['hit_rate']:.3f}, tree {r_trace['tree_bytes'] / 2**20:.1f} MiB, {r_trace['wall_s']:.1f} s")


def print_common(r: dict) -> None:
    print(f"\nCommon prefix ({r['requests']} requests of bench/serve.py's shape, {r['weights']} weights)")
    print(f"  {'run':<22} {'shared/request':>14} {'served':>8} {'of shared':>10} {'of whole segments':>18} "
          f"{'waits':>6} {'bit-exact':>9}")
    for name in ("tools_sequential", "tools_burst", "no_tools_sequential", "no_tools_burst"):
        x = r[name]
        print(f"  {name:<22} {max(x['shared_tokens']):>14} {sum(x['served_tokens']):>8} "
              f"{x['served_over_shared']:>10.3f} {x['served_over_shared_whole_segments']:>18.3f} {x['waits']:>6} "
              f"{x['bit_exact']!s:>9}")


if __name__ == "__main__":
    main()
