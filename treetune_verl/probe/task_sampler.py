# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The main job's batches: ``ArithmeticBatchSampler`` turns the built-in arithmetic task into probe batches.

Sits between the loaded model and the probe passes: fresh prompts (``arithmetic.py``), G responses each sampled from
the model under the probe's policy (``sampling.py``), rewards, group advantages (``advantages.py``), and the padded
layout of ``batch.py`` with L_max = ``generation.max_new_tokens``. Every E, U and warm-up batch of a run comes from one
sampler, so one seed fixes them all.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from omegaconf import DictConfig

from treetune_verl.probe.advantages import group_advantages
from treetune_verl.probe.arithmetic import ArithmeticItem, arithmetic_prompts, arithmetic_reward
from treetune_verl.probe.batch import make_probe_batch
from treetune_verl.probe.sampling import sample_responses


class ArithmeticBatchSampler:
    """Fresh arithmetic prompts → G sampled responses each → rewards → advantages → probe batch."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, cfg: DictConfig, seed: int) -> None:
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.rng = random.Random(seed)
        device = next(model.parameters()).device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        eos = set()
        gen_cfg = getattr(model, "generation_config", None)
        for source in (getattr(gen_cfg, "eos_token_id", None), tokenizer.eos_token_id):
            if isinstance(source, int):
                eos.add(source)
            elif source is not None:
                eos.update(int(t) for t in source)
        self.eos_token_ids = sorted(eos)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (self.eos_token_ids or [0])[0])

    def encode(self, item: ArithmeticItem) -> list[int]:
        """Prompt ids: chat-templated user turn (when the tokenizer has a template) plus the assistant pre-fill."""
        prefill = self.tokenizer(item.prefill, add_special_tokens=False)["input_ids"]
        if self.cfg.generation.use_chat_template and getattr(self.tokenizer, "chat_template", None):
            # return_dict=False: transformers 5 returns a BatchEncoding by default (not a dict: its list is its keys)
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": item.question}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            return list(ids) + list(prefill)
        question = self.tokenizer(item.question + "\n", add_special_tokens=False)["input_ids"]
        return list(question) + list(prefill)

    def sample(self, B: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(batch, info)``: a probe batch of B fresh prompts × ``batch.G`` responses (``batch.py`` layout), and
        ``info`` with the batch's ``mean_reward`` (fraction correct) and one decoded ``example``."""
        gen, G = self.cfg.generation, int(self.cfg.batch.G)
        items = arithmetic_prompts(B, int(self.cfg.prompts.max_operand), self.rng)
        prompt_ids = [self.encode(item) for item in items]
        responses, _ = sample_responses(
            self.model,
            prompt_ids,
            G,
            float(gen.temperature),
            float(gen.top_p),
            int(gen.max_new_tokens),
            self.pad_token_id,
            self.eos_token_ids,
            self.generator,
            int(gen.batch_size),
        )
        texts = [[self.tokenizer.decode(r, skip_special_tokens=True) for r in group] for group in responses]
        rewards = torch.tensor(
            [[arithmetic_reward(t, item.answer) for t in group] for group, item in zip(texts, items, strict=True)]
        )
        adv = group_advantages(rewards, str(self.cfg.advantage.estimator), float(self.cfg.advantage.eps))
        # L_max = the generation budget: a per-prompt constant, so the estimators are exactly unbiased.
        batch = make_probe_batch(prompt_ids, responses, adv, self.pad_token_id, [int(gen.max_new_tokens)] * B)
        example = {
            "prompt": f"{items[0].question} | {items[0].prefill}",
            "response": texts[0][0],
            "reward": float(rewards[0, 0]),
        }
        info = {"mean_reward": float(rewards.mean()), "example": example}
        return batch, info
