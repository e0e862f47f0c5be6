# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
#
# `make run` and `make test` are the README's contract: each works on a fresh CPU machine with nothing
# installed, setting up its environment on first use (a few minutes) and reusing it afterwards.
#
# Two stacks: STACK=current (default; .venv-current: sglang 0.5.12 + verl 0.9.1, verl's newest release and the
# sglang its extra pins) and STACK=pinned (.venv: sglang 0.5.6.post2 + verl 0.7.1, the design documents' versions).
# `make test` runs both stacks' suites side by side (the current one's: CURRENT_TESTS; the pinned one's: the whole
# suite); `make test STACK=current` or `STACK=pinned` runs one of them.

# Whether the stack was chosen (command line or environment): `make test` without a choice runs both.
STACK_CHOSEN := $(if $(filter undefined,$(origin STACK)),,yes)
STACK   ?= current
ifeq ($(STACK),current)
VENV    ?= .venv-current
else ifeq ($(STACK),pinned)
VENV    ?= .venv
else
$(error STACK must be pinned or current, got '$(STACK)')
endif
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.treetune-setup-done
ARGS    ?=
PYTEST_ARGS ?=

# The current stack's suite: the real-Engine tests (entropy and the sampled support, both stacks), the sglang side's
# version-independent tests and the 0.5.12 adapter's, the generation job (both backends) and make run's CLI, managed sessions on the real Engine
# (EngineBackend), our server on verl 0.9.1's (scoped abort), the V1 trainer's setup and seams, verl's CPU runtime
# patches and the rollout-entropy block in verl 0.9.1's GRPO on CPU (the full / resume variants, with over-sampling,
# forking tokens and the forecast on), over-sampling (the estimator / loss tables with verl's padding rows, the replay
# buffer on a real Engine, GRPO with carry-over),
# managed agents that train (sessions of two rows on a real Engine in the V1 rollout file, GRPO), the start-up check
# of every key of our rollout.custom sections, the import layout (each module alone under verl 0.9.1, the pinned-only
# ones refused naming verl 0.7.1), the entropy probe (torch only), the forecast's verl-independent parts (directional
# derivatives, the softmax-exact forecast, the early warning and its replay, the study's calibration and report; the
# forecast in verl 0.9.1's actor is in verl/v0_9_1).
CURRENT_TESTS := \
	treetune_tests/treetune_verl/sglang/test_entropy_engine_on_cpu.py \
	treetune_tests/treetune_verl/sglang/test_current_stack_on_cpu.py \
	treetune_tests/treetune_verl/sglang/test_entropy_on_cpu.py \
	treetune_tests/treetune_verl/sglang/test_config_on_cpu.py \
	treetune_tests/treetune_verl/sglang/test_support_on_cpu.py \
	treetune_tests/treetune_verl/sglang/test_support_engine_on_cpu.py \
	treetune_tests/treetune_verl/generation/test_generation_job_on_cpu.py \
	treetune_tests/treetune_verl/generation/test_quick_run_on_cpu.py \
	treetune_tests/treetune_verl/generation/test_verl_runner_on_cpu.py \
	treetune_tests/treetune_verl/generation/test_generation_verl_backend_on_cpu.py \
	treetune_tests/treetune_verl/managed/test_managed_engine_on_cpu.py \
	treetune_tests/treetune_verl/managed/test_boundaries_on_cpu.py \
	treetune_tests/treetune_verl/managed/test_node_on_cpu.py \
	treetune_tests/treetune_verl/managed/test_import_on_cpu.py \
	treetune_tests/treetune_verl/rollout/test_server_abort_on_cpu.py \
	treetune_tests/treetune_verl/rollout/test_session_on_cpu.py \
	treetune_tests/treetune_verl/rollout/test_rollout_config_on_cpu.py \
	treetune_tests/treetune_verl/rollout/test_entropy_row_on_cpu.py \
	treetune_tests/treetune_verl/rollout/test_token_ledger_on_cpu.py \
	treetune_tests/treetune_verl/verl/v0_9_1 \
	treetune_tests/treetune_verl/trainer/test_custom_keys_on_cpu.py \
	treetune_tests/treetune_verl/test_import_layout_on_cpu.py \
	treetune_tests/treetune_verl/test_seams_page_on_cpu.py \
	treetune_tests/treetune_verl/test_timing_on_cpu.py \
	treetune_tests/treetune_verl/test_log_level_on_cpu.py \
	treetune_tests/treetune_verl/probe \
	treetune_tests/treetune_verl/forecast/test_directional_on_cpu.py \
	treetune_tests/treetune_verl/forecast/test_early_warning_on_cpu.py \
	treetune_tests/treetune_verl/forecast/test_replay_warning_on_cpu.py \
	treetune_tests/treetune_verl/forecast/test_rollout_eval_on_cpu.py \
	treetune_tests/treetune_verl/forecast/test_softmax_tangent_on_cpu.py \
	treetune_tests/treetune_verl/forecast/test_study_report_on_cpu.py \
	treetune_tests/treetune_verl/control \
	treetune_tests/treetune_verl/ppo/test_padding_rows_v0_9_1_on_cpu.py \
	treetune_tests/treetune_verl/ppo/test_support_replay_on_cpu.py \
	treetune_tests/e2e/test_verl_cpu_patches_on_cpu.py \
	treetune_tests/e2e/test_check_metrics_on_cpu.py \
	treetune_tests/e2e/test_bench_abort_latency_on_cpu.py \
	treetune_tests/e2e/test_e2e_current_stack_on_cpu.py \
	treetune_tests/e2e/test_e2e_support_replay_on_cpu.py \
	treetune_tests/e2e/test_e2e_over_sample_on_cpu.py \
	treetune_tests/e2e/test_e2e_managed_on_cpu.py \
	treetune_tests/e2e/test_e2e_variants_on_cpu.py

# Every cache stays inside the repo; no model hub is reachable.
export TREETUNE_CACHE_DIR ?= $(CURDIR)/.cache
export HF_HOME            ?= $(CURDIR)/.cache/hf
export TRITON_CACHE_DIR   ?= $(CURDIR)/.cache/triton
export PRE_COMMIT_HOME    ?= $(CURDIR)/.cache/pre-commit
export PIP_CACHE_DIR      ?= $(CURDIR)/.cache/pip
export HF_HUB_OFFLINE     := 1
export TOKENIZERS_PARALLELISM := false

# The tests run one torch (OpenMP) thread per process. A suite runs several processes at once (pytest, sglang's
# scheduler, Ray's workers, an HF forward) and `make test` runs two suites on 2 cores: OpenMP's spinning threads on
# oversubscribed cores made the probe's enumeration fixture 4.5x slower (331 s against 74 s, each measured beside the
# other suite's run). Ray's workers already get one thread from Ray. OMP_NUM_THREADS=N on the command line overrides.
test test-stack test-fast: export OMP_NUM_THREADS ?= 1

.PHONY: setup run generate analyze probe test test-stack test-fast e2e e2e-multi-node study lint bench bench-probe

setup: $(STAMP)

$(STAMP): tools/cpu_env/setup.sh tools/cpu_env/constraints.txt tools/cpu_env/requirements-cpu.txt \
		tools/cpu_env/current/constraints.txt tools/cpu_env/current/requirements-cpu.txt pyproject.toml
	STACK=$(STACK) TREETUNE_VENV=$(VENV) bash tools/cpu_env/setup.sh
	touch $@

## Main job: SmolLM2-135M through the patched sglang Engine on CPU; prints a per-response entropy table,
## writes outputs/generate/{responses.jsonl,entropy.html}. Pass options with ARGS="--top-k 20 ...".
run: setup
	$(PY) -m treetune_verl.generation.quick_run $(ARGS)

## Dataset-scale generation with per-token entropy (built-in arithmetic word problems by default), resumable: a rerun
## with the same output.dir continues. Hydra overrides via ARGS, e.g. ARGS="input.path=data.parquet sampling.n=4".
generate: setup
	$(PY) -m treetune_verl.generation $(ARGS)

## Stats, plots and report.html of a generation output (or make run's JSONL): ANALYZE_DIR=outputs/generation.
ANALYZE_DIR ?= outputs/generation
analyze: setup
	$(PY) -m treetune_verl.analysis $(ANALYZE_DIR) $(ARGS)

## Entropy probe main job (SmolLM2 on CPU, built-in arithmetic prompts). Hydra overrides via ARGS.
probe: setup
	$(PY) -m treetune_verl.probe $(ARGS)

## The test suites (CPU; unit, real-class and real-Engine tests; GPU-only tests skip): the current stack's
## (CURRENT_TESTS) and the pinned stack's (the whole suite), each in its own environment, side by side (each output
## line prefixed [current] / [pinned]). `make test STACK=current` or `make test STACK=pinned` runs one of them.
ifeq ($(STACK_CHOSEN),yes)
test: test-stack
else
test: setup
	$(MAKE) --no-print-directory setup STACK=pinned
	bash tools/side_by_side.sh \
		current "$(MAKE) --no-print-directory test-stack STACK=current" \
		pinned "$(MAKE) --no-print-directory test-stack STACK=pinned"
endif

ifeq ($(STACK),current)
STACK_TESTS := $(CURRENT_TESTS)
else
STACK_TESTS :=
endif

test-stack: setup
	$(PY) -m pytest $(STACK_TESTS) $(PYTEST_ARGS)

## The STACK's suite except the tests that start a real sglang Engine.
test-fast: setup
	$(PY) -m pytest $(STACK_TESTS) -m "not engine" $(PYTEST_ARGS)

## A few GRPO steps of verl's own trainer (main_ppo) with rollout entropy, on CPU or GPU, then the acceptance check of
## outputs/e2e/metrics.jsonl. E2E_MODEL=smollm2|tiny; extra Hydra overrides via ARGS. E2E_VARIANT=full (2 training
## processes, reference model + KL loss, validation, checkpoint at step 1; outputs/e2e-full/), then E2E_VARIANT=resume
## (resumes that checkpoint to step 2; outputs/e2e-resume/): see the script's header.
E2E_MODEL ?= smollm2
E2E_VARIANT ?= base
e2e: setup
	E2E_MODEL=$(E2E_MODEL) E2E_VARIANT=$(E2E_VARIANT) PYTHON=$(PY) bash treetune_tests/e2e/test_entropy_e2e.sh $(ARGS)

## make e2e on a Ray cluster that already runs (RAY_ADDRESS), as `ray job submit` users run verl: two raylets on this
## machine from clean environments, one training process per node, the metrics file checked (README, "On a Ray cluster
## that already runs").
e2e-multi-node: setup
	PYTHON=$(PY) bash treetune_tests/e2e/multi_node_e2e.sh $(ARGS)

## Is the entropy forecast right? A collapsing and a stable GRPO run of verl's main_ppo with the forecast at every step
## (SmolLM2 on CPU), each step printed as it lands, then outputs/study/report.html (+ PNGs, study.json). Options via
## ARGS (python treetune_tests/e2e/forecast_study.py --help), e.g. ARGS="--seed 3 --root outputs/study-3".
study: setup
	$(PY) treetune_tests/e2e/forecast_study.py $(ARGS)

## pre-commit reads tracked files only: a new module not yet `git add`ed would pass unchecked, so lint refuses it.
lint: setup
	@untracked="$$(git ls-files --others --exclude-standard -- '*.py' 2>/dev/null)"; \
	if [ -n "$$untracked" ]; then \
		echo "make lint: untracked Python files, which pre-commit does not read (git add them first):"; \
		echo "$$untracked"; exit 1; \
	fi
	$(VENV)/bin/pre-commit run --all-files --show-diff-on-failure

bench: setup
	$(PY) treetune_tests/treetune_verl/sglang/bench_entropy_throughput.py $(ARGS)

bench-probe: setup
	$(PY) treetune_tests/treetune_verl/probe/bench_probe.py $(ARGS)
