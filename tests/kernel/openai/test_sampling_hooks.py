"""OpenAI's sampling parameters as token hooks (fak.kernel.openai.sampling): on numpy rows,
on the tiny model's real byte-level tokenizer, and through real kernel generations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fak.errors import InvalidInput
from fak.kernel.model.generate import only
from fak.kernel.openai.sampling import LogitBias, LogprobRecorder, Penalties, StopStrings, token_bytes

EOS = 257  # the tiny model's <|im_end|>


def _decode(kernel):
    return lambda ids: kernel.tokenizer.decode(ids, skip_special=True)


def _turn(kernel, hooks=(), **sampling):
    ks = kernel.session("acme")
    ks.append("user", "hi")
    return list(ks.generate(max_tokens=sampling.pop("max_tokens", 20), temperature=0, hooks=tuple(hooks), **sampling))


# --- on rows ------------------------------------------------------------------------
def test_logit_bias_row_and_validation() -> None:
    row = np.zeros(8, dtype=np.float32)
    row[5] = -np.inf
    out = LogitBias({1: 100, 2: -100.0, 5: 100}, vocab_size=8).adjust(0, row)
    assert out[1] == 100 and out[2] == -100 and out[5] == -np.inf and out[0] == 0
    assert LogitBias.from_openai({"3": 2.5}, 8).adjust(0, np.zeros(8, np.float32))[3] == 2.5
    for bad in ({8: 1.0}, {-1: 1.0}, {1: 100.5}, {1: math.nan}, {1: "x"}):
        with pytest.raises(InvalidInput) as e:
            LogitBias(bad, vocab_size=8)
        assert e.value.param == "logit_bias"
    with pytest.raises(InvalidInput):
        LogitBias.from_openai({"a1": 1.0}, 8)


def test_penalties_row() -> None:
    p = Penalties(presence=0.5, frequency=0.25)
    for t in (3, 3, 1):
        p.chosen(0, t)
    out = p.adjust(3, np.zeros(5, dtype=np.float32))
    assert out.tolist() == [0, -0.75, 0, -1.0, 0]
    assert Penalties().adjust(0, np.ones(3, np.float32)).tolist() == [1, 1, 1]
    with pytest.raises(InvalidInput) as e:
        Penalties(frequency=2.5)
    assert e.value.param == "frequency_penalty"


def test_logprob_recorder_row() -> None:
    r = LogprobRecorder(top=3)
    row = np.array([1.0, 3.0, 3.0, -np.inf, 2.0], dtype=np.float32)
    assert r.adjust(0, row.copy()).tolist() == row.tolist()  # observes only
    r.chosen(0, 4)
    token, logprob, top = r.steps[0]
    norm = math.log(math.exp(1) + 2 * math.exp(3) + math.exp(2))
    assert token == 4 and logprob == pytest.approx(2 - norm)
    assert [t for t, _ in top] == [1, 2, 4]  # the tie of 1 and 2 by id
    assert top[0][1] == pytest.approx(3 - norm)
    r.adjust(1, np.array([0.0, -np.inf, -np.inf, -np.inf, -np.inf], np.float32))
    r.chosen(1, 0)
    assert r.steps[1][1] == 0.0 and r.steps[1][2] == [(0, 0.0)]  # masked tokens never listed
    with pytest.raises(InvalidInput):
        LogprobRecorder(top=21)


# --- on the real tokenizer ------------------------------------------------------------
def test_token_bytes_partial_utf8(kernel) -> None:
    tok = kernel.tokenizer
    bytes_of = token_bytes(tok.tk)
    ids = tok.encode_plain("é!")
    assert len(ids) == 3  # é is two byte tokens in this byte-level vocabulary
    assert [bytes_of(t) for t in ids] == [b"\xc3", b"\xa9", b"!"]
    assert bytes_of(EOS) == b"<|im_end|>"
    r = LogprobRecorder(top=1)
    for step, t in enumerate(ids + [EOS]):
        row = np.zeros(tok.vocab_size, np.float32)
        row[t] = 5.0
        r.adjust(step, row)
        r.chosen(step, t)
    content = r.content(bytes_of, skip=tok.stop_token_ids)
    assert [c["token"] for c in content] == ["bytes:\\xc3", "bytes:\\xa9", "!"]
    assert [c["bytes"] for c in content] == [[0xC3], [0xA9], [0x21]]
    assert content[0]["top_logprobs"][0]["bytes"] == [0xC3]
    assert bytes(b for c in content for b in c["bytes"]).decode() == "é!"


def _feed(stop: StopStrings, ids: list[int]) -> list[bool]:
    seen = []
    for i, t in enumerate(ids):
        stop.chosen(i, t)
        seen.append(stop.matched)
    return seen


def test_stop_strings_across_tokens_and_characters(kernel) -> None:
    tok = kernel.tokenizer
    ids = tok.encode_plain("say é then END now")
    s = StopStrings(["é t", "END"], _decode(kernel), tok.stop_token_ids)
    seen = _feed(s, ids)
    at = seen.index(True)
    assert tok.decode(ids[: at + 1]) == "say é t"  # matched on the token that completed "é t"
    assert s.cut(s.text) == "say " and s.cut("no stop here") == "no stop here"
    forced = s.adjust(at + 1, np.zeros(tok.vocab_size, np.float32))
    assert np.flatnonzero(np.isfinite(forced)).tolist() == [EOS]
    masked = np.zeros(tok.vocab_size, np.float32)
    masked[EOS] = -np.inf  # min_tokens (or a grammar) masked the stop token: the stop string still wins
    assert np.flatnonzero(np.isfinite(s.adjust(at + 1, masked))).tolist() == [EOS]
    # half a character decodes to nothing yet: the text only ever holds whole characters
    half = StopStrings("é", _decode(kernel), tok.stop_token_ids)
    assert _feed(half, tok.encode_plain("aé")) == [False, False, True] and half.text == "aé"


def test_stop_strings_safe_prefix() -> None:
    s = StopStrings(["END", "xy"], lambda ids: "", [0])
    assert s.safe_prefix_len("hello") == 5
    assert s.safe_prefix_len("hello E") == 6  # "E" may begin END
    assert s.safe_prefix_len("hello EN") == 6
    assert s.safe_prefix_len("hello ENx") == 8  # "x" may begin xy
    assert s.safe_prefix_len("a ENDb") == 2
    assert s.safe_prefix_len("") == 0


def test_stop_strings_validation() -> None:
    for bad in ([], ["a"] * 5, [""], ["x" * 257], [3]):
        with pytest.raises(InvalidInput) as e:
            StopStrings(bad, lambda ids: "", [0])
        assert e.value.param == "stop"


# --- through kernel generations ---------------------------------------------------------
def test_logit_bias_forces_a_token(kernel) -> None:
    plain = _turn(kernel)
    target = kernel.tokenizer.encode_plain("Q")[0]
    assert target not in plain
    forced = _turn(kernel, [LogitBias({target: 100}, kernel.tokenizer.vocab_size)])
    assert forced == [target] * 20


def test_penalties_change_greedy_output(kernel) -> None:
    plain = _turn(kernel, max_tokens=40)
    assert len(set(plain)) == 1  # the random tiny model repeats one token (by a margin of ~50 logits)
    penalised = _turn(kernel, [Penalties(presence=2.0, frequency=2.0)], max_tokens=40)
    assert penalised != plain and len(set(penalised)) > 1
    assert penalised[0] == plain[0]  # nothing generated yet: the first step is unpenalised
    assert penalised == _turn(kernel, [Penalties(presence=2.0, frequency=2.0)], max_tokens=40)  # a hook per turn


def test_greedy_logprobs_are_the_maximum(kernel) -> None:
    rec = LogprobRecorder(top=5)
    ids = _turn(kernel, [Penalties(frequency=1.0), rec])
    assert [t for t, _, _ in rec.steps] == ids
    for token, logprob, top in rec.steps:
        assert top[0][0] == token and top[0][1] == logprob  # greedy drew the most probable
        assert len(top) == 5 and all(a[1] >= b[1] for a, b in zip(top, top[1:], strict=False))
        assert logprob <= 0
    content = rec.content(token_bytes(kernel.tokenizer.tk))
    assert "".join(c["token"] for c in content) == kernel.tokenizer.decode_turn(ids)


def test_stop_string_ends_generation(kernel) -> None:
    tok = kernel.tokenizer
    letters = np.array(sorted({tok.encode_plain(c)[0] for c in "abcdefghijklmnopqrstuvwxyz"}))

    class Letters:  # a grammar-like mask: varied, printable text from the random model
        def adjust(self, step: int, row: np.ndarray) -> np.ndarray:
            return only(row, letters)

        def chosen(self, step: int, token: int) -> None:
            pass

    def hooks(*more):
        return [Penalties(presence=2.0, frequency=2.0), Letters(), *more]

    full = _turn(kernel, hooks(), max_tokens=40)
    text = tok.decode_turn(full)
    assert len(text) == len(full)  # one character per token here: a 2-character stop spans 2 tokens
    at = next(i for i in range(3, len(text) - 1) if text[i] != text[i + 1] and text.find(text[i : i + 2]) == i)
    stop = StopStrings([text[at : at + 2]], _decode(kernel), tok.stop_token_ids)
    ids = _turn(kernel, hooks(stop), max_tokens=40)
    assert ids == full[: at + 2] + [EOS]  # the model was made to stop right after the stop string
    assert stop.matched and stop.text == text[: at + 2] and stop.cut(stop.text) == text[:at]
    assert stop.safe_prefix_len(text[: at + 1]) == at  # a stream holds back the stop's first half
    unmatched = StopStrings(["never"], _decode(kernel), tok.stop_token_ids)
    assert _turn(kernel, hooks(unmatched), max_tokens=40) == full and not unmatched.matched


def test_stop_strings_invalid_utf8(kernel) -> None:
    """Bytes that never form a character do not stall the text: a stop after them matches."""
    tok = kernel.tokenizer
    bad = tok.encode_plain("\u00eb")[0]  # 0xC3: a lead byte, repeated, is never valid UTF-8
    s = StopStrings(["ok"], _decode(kernel), tok.stop_token_ids)
    seen = _feed(s, [bad] * 30 + tok.encode_plain("é ok"))
    assert seen[-1] and not any(seen[:-1])
    assert s.text == tok.decode([bad] * 30 + tok.encode_plain("é ok"))


def test_token_bytes_sentencepiece_byte_fallback() -> None:
    """A Llama-2-style vocabulary: ``<0xNN>`` byte tokens, ``▁`` for spaces."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {"<unk>": 0, "<0xC3>": 1, "<0xA9>": 2, "\u2581hi": 3, "!": 4}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    bytes_of = token_bytes(tk)
    assert [bytes_of(t) for t in (1, 2, 3, 4)] == [b"\xc3", b"\xa9", b" hi", b"!"]
