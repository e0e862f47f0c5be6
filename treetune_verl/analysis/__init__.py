# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Analysis of per-token entropy over a generation output (or ``make run``'s JSONL): stats, plots, one HTML page.

``python -m treetune_verl.analysis <output dir | responses.jsonl>``. Along the data's path: ``load`` (responses as
records) -> ``stats`` (distribution, p80, share below 0.01 nats, per position, per correctness, forking tokens) ->
``plots`` (matplotlib PNGs) -> ``report_html`` (``report.html``). Imports no sglang.
"""
