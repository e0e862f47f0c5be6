# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Entropy at dataset scale: run a model over a prompt set with per-token entropy, resumably.

``python -m treetune_verl.generation [key=value ...]`` (``make generate``). Along the data's path: ``inputs`` (a
verl-format parquet, a JSONL of prompts, or the built-in ``word_problems``) -> ``engine_runner`` (the in-process
patched sglang Engine, results as they complete) -> ``scoring`` (rule-based answer check) -> ``shards`` (atomic
parquet shards in the layout of ``schema``; a rerun resumes) -> ``job`` (wiring, progress). Analysis of the output:
``treetune_verl.analysis``. ``make run``'s main job lives here too: ``quick_run`` (the CLI), ``records`` (records,
table, JSONL; shared with ``job``), ``heatmap`` (the HTML, reused by the analysis report). Spec: ``treetune_specs/2026-11-23-dataset-entropy.md``.
"""
