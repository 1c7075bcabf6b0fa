"""A tiny but complete model folder (random Llama weights, a byte-level tokenizer
with a ChatML template) so Kernel tests run the real loading path in seconds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel

from fak.kernel.model.config import ModelConfig
from fak.kernel.model.weights import random_weights, state_dict_from_weights

SPECIALS = ["<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TINY_HF = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 258,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "bos_token_id": None,
    "eos_token_id": 257,
}


def make_tiny_model_dir(folder: Path, seed: int = 0) -> Path:
    """Write config.json, model.safetensors, tokenizer.json and tokenizer_config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_HF))
    cfg = ModelConfig.from_hf(TINY_HF)
    sd = state_dict_from_weights(cfg, random_weights(cfg, seed=seed))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(SPECIALS)
    assert tk.token_to_id("<|im_end|>") == TINY_HF["eos_token_id"], tk.get_vocab_size()
    tk.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "add_bos_token": False}))
    return folder


def policy_kernel(tmp_path: Path, tiny_dir: Path, tiny_lm: Any, policy: str) -> Any:
    """A kernel on the tiny model over ``tmp_path`` (its data directory and ``policy.yaml``,
    written from ``policy``; reopened when the file is already there), as the door tests use."""
    from fak import Kernel, Settings

    path = tmp_path / "policy.yaml"
    if not path.exists():
        path.write_text(policy)
    return Kernel.open(Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, policy_path=path),
                       model=tiny_lm, progress=None)


@contextmanager
def served(tmp_path: Path, tiny_dir: Path, tiny_lm: Any, policy: str) -> Iterator[SimpleNamespace]:
    """``policy_kernel`` behind a real HTTP server: its url, the kernel and an agent key of acme."""
    from fak.api.server import serve

    k = policy_kernel(tmp_path, tiny_dir, tiny_lm, policy)
    try:
        with serve(k) as live:
            yield SimpleNamespace(url=live.url, kernel=k, key=live.key("acme", "agent"), live=live)
    finally:
        k.close()
