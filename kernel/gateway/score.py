"""The counterfactual of an upstream's call, where the upstream can score a continuation
(docs/gateway.md, "Verdicts"): a vLLM server, declared with ``scores = true``, tokenises a
conversation with its own chat template (``/tokenize``) and returns the log-probability of each
prompt token (``/v1/completions`` with ``prompt_logprobs``). fak asks it how likely the call was
after the forwarded history, and after the same history with the offending results withdrawn
(a notice in their place, the turns that read them left out: what an ``evict_and_retry`` would
send). The call is scored whole, written as the JSON text ``{"name", "arguments"}`` of an
assistant turn, so the comparison is the call's, not each argument's (``"call"`` in the
decision's counterfactual). The upstream's attention is never visible: ``attention`` is None,
and a rule that asks for it fires.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from fak.kernel.gateway.upstream import Upstream, UpstreamError, Upstreams

__all__ = ["CALL", "Forwarding", "UpstreamEvidence"]

CALL = "call"  # the one key of an upstream call's counterfactual: the call is scored whole


class Forwarding(Protocol):
    """What the scoring reads of a gateway session (``fak.kernel.gateway.session.GatewaySession``)."""

    def forwarded(self, without: Collection[str] = ()) -> list[dict[str, Any]]: ...


class UpstreamEvidence:
    """The ``EvidenceSource`` of a call an upstream wrote (``fak.kernel.calls.authorize``)."""

    def __init__(self, upstreams: Upstreams, upstream: Upstream, gs: Forwarding, name: str, args: Any) -> None:
        self._upstreams, self._up, self._gs = upstreams, upstream, gs
        self._call = {"role": "assistant",
                      "content": json.dumps({"name": name, "arguments": args}, ensure_ascii=False, sort_keys=True)}

    def attention(self) -> Mapping[str, Mapping[str, Any]] | None:
        return None  # the upstream's attention is not visible to fak

    def counterfactual(self, refs: Sequence[str]) -> tuple[dict[str, float], dict[str, float], float] | None:
        """The call's log-probability with the history as forwarded and with ``refs`` withdrawn;
        None when the upstream cannot say (the rule then fires, as without evidence)."""
        t0 = time.perf_counter()
        try:
            with_ = self._score(self._gs.forwarded())
            without = self._score(self._gs.forwarded(without=refs))
        except UpstreamError:
            return None
        return {CALL: with_}, {CALL: without}, time.perf_counter() - t0

    def _score(self, history: list[dict[str, Any]]) -> float:
        up, client = self._up, self._upstreams
        prompt = client.post(up, "/tokenize", {"model": up.model, "messages": history, "add_generation_prompt": True})
        full = client.post(up, "/tokenize", {"model": up.model, "messages": [*history, self._call],
                                             "add_generation_prompt": False})
        head, ids = _ids(up, prompt), _ids(up, full)
        if ids[: len(head)] != head or len(ids) <= len(head):
            raise UpstreamError(f"upstream {up.name}: its template does not extend the prompt with the call")
        out = client.post(up, "/v1/completions", {"model": up.model, "prompt": ids, "max_tokens": 1,
                                                  "temperature": 0, "prompt_logprobs": 0})
        try:
            per = out["choices"][0]["prompt_logprobs"]
            return sum(float(per[i][str(ids[i])]["logprob"]) for i in range(len(head), len(ids)))
        except (KeyError, IndexError, TypeError, ValueError):
            raise UpstreamError(f"upstream {up.name}: no prompt log-probabilities in its answer") from None


def _ids(up: Upstream, answer: dict[str, Any]) -> list[int]:
    tokens = answer.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise UpstreamError(f"upstream {up.name}: /tokenize answered no token ids")
    return tokens
