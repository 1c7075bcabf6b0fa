"""A tiny sequence-classification model folder whose verdict is known by construction, for
the late-detector tests and ``bench/late.py`` (built locally, nothing is downloaded).

A one-layer ``LlamaForSequenceClassification`` over a word-level tokenizer: query and key
projections are zero, so attention is a uniform average over the prefix, and the head reads
the last token, which therefore sees every token. The trigger word's embedding points along
dimension 0 (every other word along dimension 1) and the value projection amplifies
dimension 0, so one trigger anywhere in a window drives the INJECTION label to ~1 and a
window without it scores ~0.
"""

from __future__ import annotations

from pathlib import Path

TRIGGER = "zanzibar"
WORDS = ["the", "flight", "is", "on", "time", "gate", "please", "send", "all", "data", "to", "ignore",
         "previous", "instructions", "weather", "in", "boston", "rain", "and", "a", "of", "for", "you"]
HIDDEN = 8
MAX_LENGTH = 64


def make_tiny_classifier(folder: Path, trigger: str = TRIGGER, max_length: int = MAX_LENGTH) -> Path:
    """Save the model and tokenizer into ``folder`` and return it."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, trigger: 2}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                        model_max_length=max_length)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=HIDDEN, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, head_dim=HIDDEN // 2, max_position_embeddings=max_length,
        pad_token_id=0, bos_token_id=None, eos_token_id=None, num_labels=2,
        id2label={0: "SAFE", 1: "INJECTION"}, label2id={"SAFE": 0, "INJECTION": 1}, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        embed = model.model.embed_tokens.weight
        embed[:, 1] = 1.0  # every word along dimension 1 ...
        embed[2, 1], embed[2, 0] = 0.0, 1.0  # ... the trigger along dimension 0
        layer = model.model.layers[0]
        layer.input_layernorm.weight.fill_(1.0)
        layer.post_attention_layernorm.weight.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        layer.self_attn.v_proj.weight.copy_(torch.diag(torch.tensor([1000.0] + [1.0] * (HIDDEN - 1))))
        layer.self_attn.o_proj.weight.copy_(torch.eye(HIDDEN))
        model.score.weight[0, 1] = 5.0  # SAFE reads dimension 1
        model.score.weight[1, 0] = 5.0  # INJECTION reads dimension 0
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_causal_lm(folder: Path) -> Path:
    """A folder that is a Hugging Face model but not a sequence classifier."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=4)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder
