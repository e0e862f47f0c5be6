# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``ProbeComponents``: microbatched accumulation of Σ_b X_b and Σ_b Y_b into parameter-sized buffers.

Buffers are ``dict[parameter name -> tensor]`` over the trainable parameters, in ``probe.buffers_dtype`` (fp32 by
default) on ``probe.buffers_device`` (CPU by default, so they cost no accelerator memory). Each microbatch runs one
forward, builds a surrogate loss (``estimators.py``), calls ``backward()`` and adds ``.grad`` into the buffer. Buffers
hold SUMS over prompts, so the microbatch size changes nothing but memory; ``mixed_probe`` takes the means.

Side effects: none on the model beyond the passes themselves. Existing ``.grad`` tensors are stashed and restored,
the train/eval mode is restored (passes run in eval mode: the policy that sampled the responses has no dropout), and
the only state that changes is the ``residual_mu`` baseline, updated once per ``accumulate_sum_X`` call.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch
from omegaconf import DictConfig

from treetune_verl.probe.batch import iter_microbatches, validate_probe_batch
from treetune_verl.probe.config import DTYPES, resolve_config
from treetune_verl.probe.estimators import ResidualBaseline, naive_x_loss, rb_residual_x_loss, y_loss
from treetune_verl.probe.teacher_forcing import TeacherForced, teacher_force

ParamBuffer = dict[str, torch.Tensor]


def is_ddp(model: torch.nn.Module) -> bool:
    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


def is_multiprocess_ddp(model: torch.nn.Module) -> bool:
    """DDP-wrapped and running with more than one process (buffers and counts then need an all-reduce)."""
    return is_ddp(model) and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """dtype of the first floating-point parameter."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


@contextlib.contextmanager
def probe_pass_context(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> Iterator[None]:
    """Eval mode and an empty ``.grad`` on every trainable parameter; both restored on exit."""
    was_training = model.training
    stashed = [p.grad for p in params]
    for p in params:
        p.grad = None
    model.eval()
    try:
        yield
    finally:
        for p, g in zip(params, stashed, strict=True):
            p.grad = g
        model.train(was_training)


class ProbeComponents:
    """X/Y accumulators and buffer utilities for one model.

    Args:
        model: HF-style causal LM (``nn.Module``, optionally DDP-wrapped) with at least one trainable parameter.
        config: probe config (full or partial, see ``config/probe.yaml``); reads ``generation`` (the sampling
            policy of the batches it will see), ``estimator`` and ``probe``.
        optimizer: the optimizer whose step is probed; only read (its next step Δθ in ``run_mixed_probe``).

    Raises:
        ValueError: if the model has no trainable parameters, or for an invalid config value (naming the key).
    """

    def __init__(
        self, model: torch.nn.Module, config: DictConfig | dict | None, optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        cfg = resolve_config(config)
        self.model = model
        self.optimizer = optimizer
        self.named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.named_params:
            raise ValueError("the model has no trainable parameters (requires_grad=False everywhere): nothing to probe")
        self.params = [p for _, p in self.named_params]
        self.temperature = float(cfg.generation.temperature)
        self.top_p = float(cfg.generation.top_p)
        self.x_mode = str(cfg.estimator.x_estimator_mode)
        self.baseline_mode = str(cfg.estimator.baseline.mode)
        self.rb_normalize_by_length = bool(cfg.estimator.rb_normalize_by_length)
        self.weighting_mode = str(cfg.probe.weighting_mode)
        self.preconditioner = str(cfg.probe.preconditioner)
        self.buffers_dtype = DTYPES[str(cfg.probe.buffers_dtype)]
        self.buffers_device = self.params[0].device if cfg.probe.buffers_device == "model" else torch.device("cpu")
        self.baseline = ResidualBaseline(float(cfg.estimator.baseline.ema_decay))
        self.last_timing: dict[str, float] = {}

    # ----------------------------------------------------------------------------------------- buffer utilities
    def zeros_like_params(
        self, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> ParamBuffer:
        """Zero buffer keyed by parameter name, one tensor per trainable parameter."""
        dtype = dtype or self.buffers_dtype
        device = device or self.buffers_device
        return {n: torch.zeros(p.shape, dtype=dtype, device=device) for n, p in self.named_params}

    def add_into_param_buffer(self, buf: ParamBuffer, scale: float = 1.0) -> None:
        """``buf[name] += scale · p.grad`` for every parameter with a gradient (None grads skipped)."""
        for name, p in self.named_params:
            if p.grad is None:
                continue
            grad = p.grad.detach()
            buf[name].add_(grad.to(device=buf[name].device, dtype=buf[name].dtype), alpha=scale)

    @staticmethod
    def dot_param_buffers(buf_a: ParamBuffer, buf_b: ParamBuffer) -> float:
        """Σ over parameters of ⟨a, b⟩, accumulated in fp64."""
        if buf_a.keys() != buf_b.keys():
            raise ValueError("dot_param_buffers: the buffers have different parameter names")
        total = torch.zeros((), dtype=torch.float64)
        for name, a in buf_a.items():
            total += (a.double() * buf_b[name].to(a.device).double()).sum().cpu()
        return float(total)

    @staticmethod
    def scale_buffer(buf: ParamBuffer, scale: float) -> ParamBuffer:
        """A new buffer ``scale · buf``."""
        return {n: t * scale for n, t in buf.items()}

    # ----------------------------------------------------------------------------------------- passes
    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast to the model's dtype for bf16/fp16 models; nothing for fp32 (or fp64) models."""
        dtype = model_dtype(self.model)
        if dtype in (torch.bfloat16, torch.float16):
            return torch.autocast(device_type=self.params[0].device.type, dtype=dtype)
        return contextlib.nullcontext()

    def _no_sync(self) -> contextlib.AbstractContextManager:
        # Per-microbatch gradients are summed into our own buffers; a DDP all-reduce per backward would be wasted.
        return self.model.no_sync() if is_ddp(self.model) else contextlib.nullcontext()

    def teacher_forced_microbatches(
        self,
        batch: dict[str, torch.Tensor],
        mb_size_prompts: int,
        with_entropy: bool,
        name: str = "batch",
        allow_zero_probability: bool = False,
        share_prompt: bool = False,
        keep_log_probs: bool = False,
    ) -> Iterator[tuple[dict[str, torch.Tensor], TeacherForced]]:
        """Validate ``batch``, then yield ``(microbatch, teacher-forced results)`` along the prompt dimension.

        Runs inside :func:`probe_pass_context` (eval mode, ``.grad`` stashed and restored) with autocast following
        the model's dtype; the caller may ``backward()`` through each result before taking the next one.
        ``allow_zero_probability``, ``share_prompt``, ``keep_log_probs``: see :func:`teacher_force`.
        """
        _, _, response_col = validate_probe_batch(batch, name)
        with probe_pass_context(self.model, self.params):
            for mb in iter_microbatches(batch, mb_size_prompts):
                with self.autocast():
                    tf = teacher_force(
                        self.model,
                        mb,
                        response_col,
                        self.temperature,
                        self.top_p,
                        with_entropy,
                        allow_zero_probability,
                        share_prompt,
                        keep_log_probs,
                    )
                yield mb, tf

    def _accumulate(
        self,
        batch: dict[str, torch.Tensor],
        mb_size_prompts: int,
        loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor],
        with_entropy: bool,
        name: str,
    ) -> ParamBuffer:
        buf = self.zeros_like_params()
        for mb, tf in self.teacher_forced_microbatches(batch, mb_size_prompts, with_entropy, name):
            loss = loss_fn({"tf": tf, **mb})
            with self._no_sync():
                loss.backward()
            self.add_into_param_buffer(buf)
            for p in self.params:
                p.grad = None
        return buf

    def x_surrogate(self, R: int) -> tuple[Callable[[dict], torch.Tensor], Callable[[], None]]:
        """The X surrogate of ``estimator.x_estimator_mode`` for the microbatches of one E batch of response width R.

        Returns ``(loss_fn, finish)``: ``loss_fn({"tf": TeacherForced, **microbatch})`` is the loss whose gradient is
        Σ_b X_b over the microbatch (``rb_residual`` needs ``tf.entropies``); ``finish()``, called once after the
        batch's last microbatch, folds its residuals into the ``residual_mu`` baseline (read once, before the first).
        """
        if self.x_mode == "naive":

            def naive(mb: dict) -> torch.Tensor:
                return naive_x_loss(mb["tf"], mb["max_lengths"], self.weighting_mode)

            return naive, lambda: None
        mu = self.baseline.vector(R) if self.baseline_mode == "residual_mu" else None
        residual_sum = torch.zeros(R, dtype=torch.float64)
        residual_count = torch.zeros(R, dtype=torch.float64)

        def rb(mb: dict) -> torch.Tensor:
            loss, r_sum, r_count = rb_residual_x_loss(
                mb["tf"], mb["max_lengths"], mu, self.rb_normalize_by_length, self.baseline_mode == "loo"
            )
            residual_sum.add_(r_sum)
            residual_count.add_(r_count)
            return loss

        def finish() -> None:
            if self.baseline_mode == "residual_mu":
                self.baseline.update(residual_sum, residual_count)

        return rb, finish

    def accumulate_sum_X(self, E_batch: dict[str, torch.Tensor], mb_size_prompts: int) -> tuple[ParamBuffer, int]:
        """Σ over E's prompts of X_b (estimator per ``estimator.x_estimator_mode``); returns ``(buffer, B_E)``.

        With ``residual_mu``, μ is read once before the first microbatch and updated once after the last, from the
        whole batch: the result does not depend on ``mb_size_prompts`` and no sample meets a baseline built from it.

        Raises:
            ValueError: bad batch layout/shapes, an empty response, or G < 2 with the naive (leave-one-out) estimator.
        """
        B, _, P = validate_probe_batch(E_batch, "E_batch")
        start = time.perf_counter()
        loss_fn, finish = self.x_surrogate(E_batch["sequences"].shape[-1] - P)
        buf = self._accumulate(E_batch, mb_size_prompts, loss_fn, self.x_mode == "rb_residual", "E_batch")
        finish()
        self.last_timing = {"X_s": time.perf_counter() - start}
        return buf, B

    @torch.no_grad()
    def warm_baseline(self, batch: dict[str, torch.Tensor], mb_size_prompts: int, name: str = "batch") -> bool:
        """Fold ``batch``'s residuals into the ``residual_mu`` baseline as ``accumulate_sum_X`` would, without X
        (one forward with entropies per microbatch, no graph); returns whether there was such a baseline.

        For a batch independent of every E the baseline is then applied to: μ stays free of the sample it meets.
        """
        if self.x_mode != "rb_residual" or self.baseline_mode != "residual_mu":
            return False
        _, _, P = validate_probe_batch(batch, name)
        loss_fn, finish = self.x_surrogate(batch["sequences"].shape[-1] - P)
        for mb, tf in self.teacher_forced_microbatches(batch, mb_size_prompts, True, name):
            loss_fn({"tf": tf, **mb})
        finish()
        return True

    def accumulate_sum_Y(self, U_batch: dict[str, torch.Tensor], mb_size_prompts: int) -> tuple[ParamBuffer, int]:
        """Σ over U's prompts of Y_b = ∇ mean_g (A/L_max)·S (the Dr.GRPO objective's gradient); ``(buffer, B_U)``.

        The optimizer's step from the mean is taken by ``mixed_probe.estimate_mean_Y`` (``optimizer_step.py``).
        """
        B, _, _ = validate_probe_batch(U_batch, "U_batch")
        start = time.perf_counter()

        def loss_fn(mb: dict) -> torch.Tensor:
            return y_loss(mb["tf"], mb["advantages"], mb["max_lengths"])

        buf = self._accumulate(U_batch, mb_size_prompts, loss_fn, False, "U_batch")
        self.last_timing = {"Y_s": time.perf_counter() - start}
        return buf, B
