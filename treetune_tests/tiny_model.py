# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""A tiny random Qwen2 built locally (no hub): seeded weights, a byte-level BPE tokenizer, a ChatML template.

Both transformers and sglang load the folder. Vocabulary ~430 tokens, hidden 64, 2 layers, fp32: an sglang CPU
Engine starts on it in ~20 s and decodes hundreds of tokens/s, so tests can afford many requests.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Entropy measures the uncertainty of a distribution, in nats or bits.",
    "What is 7 plus 5? The answer is 12.",
    "Reinforcement learning from verifiable rewards trains language models with policy gradients.",
    "A tool call returns a result; the assistant then continues the conversation.",
    "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \"",
]
_DONE = ".tiny-model-complete"


def build_tiny_qwen2(path: Path, seed: int = 0, vocab_size: int = 432) -> Path:
    """Write the tiny model to ``path`` (once; reused if complete) and return ``path``."""
    path = Path(path)
    if (path / _DONE).exists():
        return path
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
        architectures=["Qwen2ForCausalLM"],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # Wider logits than the default init so sampled entropies spread over (0, log V) instead of sitting at log V.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    (path / _DONE).write_text(f"seed={seed}\n")
    return path
