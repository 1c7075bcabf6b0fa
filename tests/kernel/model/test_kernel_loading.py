"""Loading weights by path: HF folders, GGUF files, and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from support.kernel_helpers import tiny_model

from fak.kernel.model.config import ModelError
from fak.kernel.model.loader import load_model
from fak.kernel.model.weights import state_dict_from_weights


def _hf_folder(tmp_path, model) -> None:  # noqa: ANN001
    (tmp_path / "config.json").write_text(json.dumps(model.cfg.to_hf()))
    sd = {k: v.contiguous().clone() for k, v in state_dict_from_weights(model.cfg, model.w).items()}
    save_file(sd, str(tmp_path / "model.safetensors"))


def test_hf_folder_loads_the_same_model(tmp_path) -> None:
    model = tiny_model(tie_word_embeddings=False)
    _hf_folder(tmp_path, model)
    # an HF folder needs a tokenizer too: reuse a minimal byte-level one
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.BPE(vocab={chr(i + 33): i for i in range(200)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.save(str(tmp_path / "tokenizer.json"))
    loaded = load_model(tmp_path)
    ids = list(range(1, 40))
    a = model.forward(ids, model.new_cache(), all_logits=True)
    b = loaded.model.forward(ids, loaded.model.new_cache(), all_logits=True)
    assert torch.equal(a, b)


@pytest.mark.parametrize("arch", ["gpt2", "qwen3_moe", "mixtral"])
def test_unsupported_architecture_is_refused(tmp_path, arch: str) -> None:
    """Families fak does not run are refused by model_type (Qwen2, Qwen3 and Mistral run:
    tests/kernel/model/test_model_families.py)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": arch, "architectures": ["X"]}))
    with pytest.raises(ModelError, match=f"unsupported architecture '{arch}'"):
        load_model(tmp_path)


def test_non_llama_gguf_is_refused(tmp_path) -> None:
    import gguf

    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="unsupported architecture 'gpt2'"):
        load_model(path)


def test_cli_reports_a_missing_model_without_traceback(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fak.cli", "info", "--model", str(tmp_path / "missing.gguf")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert "model not found" in out.stderr and "Traceback" not in out.stderr
