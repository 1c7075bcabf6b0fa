"""A streamed answer's text costs the same per token however long the answer is: the stream's
decoder (``TextDecoder``), the stop-string watcher (``StopStrings``) and what a stream may show
(``Shown``) look only at the last few tokens' text. Counted on the real tokenizer (how many token
ids each step decodes, how much text ``Shown`` holds), not timed; and each gives the text the
whole-text computation gives."""

from __future__ import annotations

import random

from fak.kernel.calls.tool_text import OPEN, safe_text_len
from fak.kernel.openai.answer import Shown
from fak.kernel.openai.sampling import StopStrings
from fak.kernel.session.tokens import TextDecoder

TEXT = ("Flight LH400 Frankfurt–Boston leaves at 14:05 from gate B22; café déjà vu, naïve façade, "
        "東京 → Zürich ✈ 🙂. Boarding starts forty minutes before departure.\n")


class Counting:
    """The real tokenizer, counting the token ids it is asked to decode."""

    def __init__(self, tok) -> None:  # noqa: ANN001
        self.tok = tok
        self.stop_token_ids = tok.stop_token_ids
        self.ids = 0

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        self.ids += len(ids)
        return self.tok.decode(ids, skip_special=skip_special)


def _long_ids(tok) -> list[int]:  # noqa: ANN001
    ids = tok.encode_plain(TEXT * 60)
    assert len(ids) > 2000
    return ids


def test_text_decoder_decodes_a_bounded_window_per_token(kernel) -> None:
    tok = kernel.tokenizer
    ids = _long_ids(tok)
    counting = Counting(tok)
    decoder = TextDecoder(counting)
    costs, pieces = [], []
    for t in ids:
        before = counting.ids
        pieces.append(decoder.push(t))
        costs.append(counting.ids - before)
    assert "".join(pieces) == decoder.emitted == tok.decode(ids, skip_special=True)
    assert max(costs) <= 16  # a few tokens of context and the ones since the last whole character
    assert sum(costs[-500:]) <= sum(costs[:500]) * 1.1  # the 2,000th token costs what the 1st did


def test_stop_strings_decode_a_bounded_window_per_token(kernel) -> None:
    tok = kernel.tokenizer
    ids = _long_ids(tok)
    counting = Counting(tok)
    stops = StopStrings(["never written", "Zürich ✈ 🙂!"], lambda x: counting.decode(x, skip_special=True),
                        tok.stop_token_ids)
    costs = []
    for step, t in enumerate(ids):
        before = counting.ids
        stops.chosen(step, t)
        costs.append(counting.ids - before)
    assert not stops.matched and stops.text == tok.decode(ids, skip_special=True)
    assert max(costs) <= 16 and sum(costs[-500:]) <= sum(costs[:500]) * 1.1
    late = StopStrings(["Boarding starts"], lambda x: tok.decode(x, skip_special=True), tok.stop_token_ids)
    for step, t in enumerate(ids):
        late.chosen(step, t)
        if late.matched:
            break
    whole = tok.decode(ids, skip_special=True)
    assert late.matched and late.cut(late.text) == whole[:whole.index("Boarding starts")]


def _whole(text: str, stops: list[str], calls: bool) -> int:
    """What the stream could show of the whole text, computed on the whole text."""
    n = len(text)
    if stops:
        n = min(n, StopStrings(stops, lambda ids: "", [0]).safe_prefix_len(text))
    if calls:
        n = min(n, safe_text_len(text))
    return n


def test_shown_sends_what_the_whole_text_computation_allows_holding_little() -> None:
    rng = random.Random(7)
    alphabet = ["a", "b", " ", "<", ">", "tool", "_call", "END", "E", "N", "é", "\n"]
    for case in range(400):
        stops = rng.sample(["END", "b<t", "aa", "<tool", "ENDE"], rng.randint(0, 2))
        calls = rng.random() < 0.6
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        shown, sent, so_far = Shown(stops, calls=calls), "", ""
        reach = max([len(x) for x in stops] + ([len(OPEN)] if calls else []) + [0])
        while so_far != text:
            piece = text[len(so_far):len(so_far) + rng.randint(1, 5)]
            so_far += piece
            sent += shown.feed(piece)
            assert sent == so_far[:_whole(so_far, stops, calls)], (case, stops, calls, so_far)
            assert len(shown.held) < 2 * reach + len(piece)  # never the whole answer


def test_shown_holds_little_of_a_long_tool_call() -> None:
    shown = Shown(["STOP"], calls=True)
    out = shown.feed("Let me look that up. <tool_call>")
    for _ in range(5000):  # a call's arguments go on and on: none of it is content
        out += shown.feed('{"q": "flights"} ')
        assert len(shown.held) < 40
    assert out == "Let me look that up. "
    shown = Shown(["STOP"], calls=True)
    assert shown.feed("text <tool_call>") + shown.feed("{}") == "text "
