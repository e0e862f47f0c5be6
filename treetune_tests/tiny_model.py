# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The tests' one tiny-model builder: seeded random causal LMs built locally (no hub).

- :func:`tiny_causal_lm`: the model itself (Llama or Qwen2 architecture, fp32, seeded), used by all of these.
- :func:`build_tiny_qwen2`: an HF folder with a byte-level BPE tokenizer and a ChatML template; both transformers and
  sglang load it. Vocabulary ~430 tokens, hidden 64, 2 layers: an sglang CPU Engine starts on it in ~20 s and
  decodes hundreds of tokens/s, so tests can afford many requests (fixture ``tiny_model_dir``).
- :func:`build_char_llama`: an HF folder with a character-level tokenizer and no chat template (the probe's
  raw-prompt path).
- The probe's enumerable 5-token policy (``treetune_tests/treetune_verl/probe/tiny.py``) is ``tiny_causal_lm`` too.
"""

from __future__ import annotations

from pathlib import Path

from treetune_verl.model_cache import publish

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


def tiny_causal_lm(
    arch: str,
    vocab_size: int,
    hidden: int,
    *,
    layers: int = 1,
    heads: int = 2,
    kv_heads: int = 1,
    max_positions: int = 128,
    init_std: float = 0.02,
    lm_head_std: float | None = None,
    seed: int = 0,
    **token_ids: int | None,
):
    """A seeded, randomly initialised fp32 ``LlamaForCausalLM`` (``arch="llama"``) or ``Qwen2ForCausalLM``.

    ``intermediate_size = 2 * hidden``, untied embeddings; ``token_ids`` are ``pad_token_id`` / ``bos_token_id`` /
    ``eos_token_id``. ``lm_head_std`` re-draws the output layer wider than ``init_std`` (logits spread, so entropies
    vary instead of sitting at log V). Returned in eval mode.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=init_std,
        tie_word_embeddings=False,
        torch_dtype="float32",
        **token_ids,
    )
    torch.manual_seed(seed)
    model = model_cls(config).float()
    if lm_head_std is not None:
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, lm_head_std)
    return model.eval()


def build_char_llama(path: Path, seed: int = 0) -> Path:
    """A character-level tokenizer (no chat template) and a 1-layer Llama over its 73 tokens, saved at ``path``."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for char in string.digits + string.ascii_letters + " ?+=.,!\n":
        vocab[char] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    model = tiny_causal_lm(
        "llama", len(vocab), 16, init_std=0.3, seed=seed, pad_token_id=0, bos_token_id=None, eos_token_id=1
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


def build_tiny_qwen2(path: Path, seed: int = 0, vocab_size: int = 432) -> Path:
    """Write the tiny model to ``path`` (once; reused if complete) and return ``path``."""
    path = Path(path)
    if (path / _DONE).exists():
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

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

    model = tiny_causal_lm(
        "qwen2",
        len(tokenizer),
        64,
        layers=2,
        heads=4,
        kv_heads=2,
        max_positions=1024,
        lm_head_std=0.5,
        seed=seed,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )

    def save(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        (folder / _DONE).write_text(f"seed={seed}\n")

    return publish(path, save, _DONE)
