# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Is the entropy forecast right? Two GRPO runs of verl's own ``main_ppo`` with our blocks on SmolLM2-135M, one whose
entropy collapses and one whose entropy stays, the forecast at every step, then a report (``make study``).

    make study                                   # both arms, outputs/study/{collapsing,stable}/ and report.html
    make study STACK=pinned                      # the same on verl 0.7.1 + sglang 0.5.6.post2
    python treetune_tests/e2e/forecast_study.py --arms collapsing --collapsing-steps 20 --root outputs/study-b --seed 3

Each arm is ``treetune_tests/e2e/test_entropy_e2e.sh`` (the e2e run: Ray, FSDP2 actor, sglang CPU Engine, the
rollout-entropy block and ``E2E_FORECAST=1``: the forecast block, every step) with:

- ``collapsing``: AdamW lr 1e-4 (the e2e run's), warmed up over 6 steps, 4 prompts x 4 responses of up to 32 tokens
  per step (``--rollout-n``): on CPU its rollout entropy falls below half of step 1's within ~10 steps
  (``treetune_specs/2026-11-28-forecast-calibration.md``);
- ``stable``: the same at lr 5e-6 (1e-5 at 2 responses per prompt: at 4 it fell by half in 11 steps);
- issue 46's arms, the collapsing arm's settings and steps with one block each (``ARM_BLOCKS``): ``controlled`` (the
  entropy controller holding E's entropy in a band), ``reactive`` (TRL's adaptive coefficient through the same
  entropy step), ``clip_cov`` and ``kl_cov`` (verl's loss modes at their
  recipe's settings), e.g. ``--arms collapsing,controlled,reactive,clip_cov,kl_cov --collapsing-steps 30``;

and E = every prompt of the step (``eval_share=1.0``: 4 prompts x 4 fresh responses; at 2 responses per prompt the
forecast's standard error was 0.4-0.65 of the change on the pinned runs, at 4 it is 0.23-0.31), ``data.seed`` = ``--seed``
when given (the prompts' order; verl's default order otherwise) and, with ``--record``, one file per forecast with E's token values (``forecast/record.py``).
Each arm's step is printed as it lands (rollout entropy, reward, length, the forecast exact in the softmax ± its
predictive SE, its first-order term ΔH₁ ± SE, realised ± SE, warning); the report (``treetune_verl.forecast.study_report``,
with ``treetune_verl.control.report``'s section where an arm ran the controller: its decisions per step and every
arm's band hold on its band) then writes ``report.html`` with its PNGs and ``study.json`` under
``--root``. The arms run one after the other on the whole machine; an arm that fails stops the study (its output is
in ``<root>/<arm>/e2e_output.txt``).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from treetune_verl.control.report import control_section
from treetune_verl.forecast.calibration import predictive_se, read_run
from treetune_verl.forecast.study_report import write_report

ROOT = Path(__file__).resolve().parents[2]
E2E_SCRIPT = ROOT / "treetune_tests" / "e2e" / "test_entropy_e2e.sh"
FORECAST = "actor_rollout_ref.rollout.custom.entropy_forecast"
# AdamW learning rate per arm (--collapsing-lr, --stable-lr). The stable arm's: at 4 responses per prompt lr 1e-5
# (the stable arm's at 2) took the rollout entropy from 1.58 to 0.81 nats in 11 steps on the current stack (more groups
# with unequal rewards: larger steps), with the collapse warning at steps 11-12.
LEARNING_RATES = {"collapsing": 1e-4, "stable": 5e-6}

# Issue 46's arms: the collapsing arm (its learning rate, --collapsing-lr, and steps, --collapsing-steps) with one
# block each. ``controlled``: the entropy controller (treetune_verl/control), its band chosen before its first run
# (80 % of E's token entropy at the first update, 0.8 nats wide); ``reactive``: the same band judged by TRL's rule. ``clip_cov`` / ``kl_cov``: verl's own loss modes
# (Cui et al. 2025) at the settings of verl's recipe (recipe/entropy/7b_clip_cov.sh, 7b_kl_cov.sh, before the
# recipes left verl's repository in #4795). Their ratios are shares of the batch's tokens: at this run's ~400 tokens a
# step, 0.0002 selects no token and 0.002 at most one, so here they are close to stock, as published.
CONTROL = "actor_rollout_ref.rollout.custom.entropy_control"
POLICY_LOSS = "actor_rollout_ref.actor.policy_loss"
ARM_BLOCKS = {
    "controlled": [f"+{CONTROL}.target_fraction=0.8", f"+{CONTROL}.width=0.8"],
    # TRL's adaptive coefficient (its default step, 0.005 per update; its target: the same band's centre) through
    # the same entropy step: the arm that reacts to the entropy measured instead of deciding from the forecast
    "reactive": [f"+{CONTROL}.target_fraction=0.8", f"+{CONTROL}.width=0.8", f"+{CONTROL}.rule=reactive"],
    "clip_cov": [
        f"{POLICY_LOSS}.loss_mode=clip_cov",
        "actor_rollout_ref.actor.clip_ratio_low=1",
        "actor_rollout_ref.actor.clip_ratio_high=1",
        f"{POLICY_LOSS}.clip_cov_ratio=0.0002",
        f"{POLICY_LOSS}.clip_cov_lb=1.0",
        f"{POLICY_LOSS}.clip_cov_ub=5.0",
    ],
    "kl_cov": [f"{POLICY_LOSS}.loss_mode=kl_cov", f"{POLICY_LOSS}.kl_cov_ratio=0.002", f"{POLICY_LOSS}.ppo_kl_coef=1"],
}
ARMS = (*LEARNING_RATES, *ARM_BLOCKS)


def arm_learning_rate(arm: str, args: argparse.Namespace) -> float:
    """The arm's AdamW learning rate: its own option, or the collapsing arm's for issue 46's arms."""
    return getattr(args, f"{arm}_lr") if arm in LEARNING_RATES else args.collapsing_lr


# Both arms, after the e2e script's settings: a 32-token response budget (the reward's format pays for short answers;
# steps take ~45 s instead of ~60 s) and a linear learning-rate warm-up over 6 steps (verl's get_constant_schedule_
# with_warmup: the first optimizer step at lr 0, Adam's moments filled before the steps grow). Without the warm-up,
# Adam's first step moves every parameter by the learning rate whatever its gradient: at lr 1e-4 and 32 tokens it
# halved the entropy in that one step, and at 64 tokens runs collapsed, exploded or stayed (2026-11-28 spec).
COMMON = ["data.max_response_length=32", "actor_rollout_ref.actor.optim.lr_warmup_steps=6"]


def arm_overrides(lr: float, seed: int | None, record_dir: Path | None, rollout_n: int | None = None) -> list[str]:
    """The Hydra overrides of one arm, after the e2e script's own (``rollout_n``: responses per prompt, both the
    step's GRPO groups and E's; the e2e script's 2 when ``None``)."""
    overrides = [*COMMON, f"actor_rollout_ref.actor.optim.lr={lr:g}", f"{FORECAST}.eval_share=1.0"]
    if rollout_n is not None:
        overrides.append(f"actor_rollout_ref.rollout.n={rollout_n}")
    if seed is not None:
        overrides.append(f"data.seed={seed}")
    if record_dir is not None:
        overrides.append(f"+{FORECAST}.record_dir={record_dir}")
    return overrides


def _fmt(value: float, se: float = math.nan) -> str:
    if not math.isfinite(value):
        return "-"
    return f"{value:+.4f}" + (f"±{se:.4f}" if math.isfinite(se) else "")


def progress_line(arm: str, step) -> str:
    """One step of an arm on the console."""
    return (
        f"[study {arm}] step {step.step:3d}  rollout entropy {step.rollout_entropy:.3f}  reward {step.reward:.3f}  "
        f"length {step.response_length:5.1f}  forecast {_fmt(step.softmax, predictive_se(step))}  "
        f"ΔH₁ {_fmt(step.forecast, step.forecast_se)}  realised {_fmt(step.realised, step.realised_se)}  "
        f"{'WARNING' if step.warning else ''}"
    ).rstrip()


def run_arm(arm: str, steps: int, args: argparse.Namespace) -> Path:
    """Run one arm to its end, printing each step as verl logs it; returns its workdir.

    Raises:
        RuntimeError: the e2e script failed (the tail of its output in the message).
    """
    work = (args.root / arm).resolve()
    work.mkdir(parents=True, exist_ok=True)
    record = work / "records" if args.record else None
    env = {
        **os.environ,
        "E2E_MODEL": args.model,
        "E2E_STEPS": str(steps),
        "E2E_FORECAST": "1",
        "E2E_WORKDIR": str(work),
        "PYTHON": sys.executable,
    }
    lr = arm_learning_rate(arm, args)
    command = ["bash", str(E2E_SCRIPT), *arm_overrides(lr, args.seed, record, args.rollout_n), *ARM_BLOCKS.get(arm, [])]
    metrics, output = work / "metrics.jsonl", work / "e2e_output.txt"
    seed = "verl's default" if args.seed is None else args.seed
    print(
        f"[study {arm}] {args.model}, {steps} steps, lr {lr:g}, n {args.rollout_n}, data.seed {seed}: {work}",
        flush=True,
    )
    start, shown = time.monotonic(), 0
    with output.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        while True:
            done = process.poll() is not None
            if metrics.exists():
                try:
                    run = read_run(metrics)
                except ValueError:  # the first line not written yet, or a line being written
                    run = []
                for step in run[shown:]:
                    print(progress_line(arm, step) + f"  ({time.monotonic() - start:.0f} s)", flush=True)
                shown = max(shown, len(run))
            if done:
                break
            time.sleep(2)
    if process.returncode != 0:
        tail = "\n".join(output.read_text().splitlines()[-30:])
        raise RuntimeError(f"study arm {arm} failed (exit {process.returncode}; {output}):\n{tail}")
    return work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT / "outputs" / "study")
    parser.add_argument("--arms", default="collapsing,stable", help="comma-separated, of: " + ", ".join(ARMS))
    parser.add_argument("--collapsing-steps", type=int, default=18)
    parser.add_argument("--stable-steps", type=int, default=12)
    parser.add_argument("--collapsing-lr", type=float, default=LEARNING_RATES["collapsing"])
    parser.add_argument("--stable-lr", type=float, default=LEARNING_RATES["stable"])
    parser.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"), help="tiny: the tests' random Qwen2")
    parser.add_argument("--seed", type=int, default=None, help="data.seed: the order of the prompts (default: verl's)")
    parser.add_argument("--record", action="store_true", help="one file per forecast with E's token values")
    parser.add_argument("--rollout-n", type=int, default=4, help="responses per prompt (the GRPO group and E's)")
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from the arms' metrics")
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if args.rollout_n < 1:
        parser.error(f"--rollout-n must be >= 1, got {args.rollout_n}")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or not arms:
        parser.error(f"--arms: unknown {unknown or arms} (known: {', '.join(ARMS)})")
    start = time.monotonic()
    workdirs = {}
    for arm in arms:
        steps = args.stable_steps if arm == "stable" else args.collapsing_steps
        workdirs[arm] = (args.root / arm).resolve() if args.report_only else run_arm(arm, steps, args)
    metrics = {arm: work / "metrics.jsonl" for arm, work in workdirs.items()}
    # issue 46's arms: the controller's decisions and every arm's band hold on the controlled arm's band
    notes, plots = control_section({arm: read_run(path) for arm, path in metrics.items()}, args.root)
    report = write_report(metrics, args.root, notes=notes, extra_plots=plots)
    print(f"[study] report: {report} ({time.monotonic() - start:.0f} s in all)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
