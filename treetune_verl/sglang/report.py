# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Deprecated (one release): records, table and JSONL are :mod:`treetune_verl.generation.records`; the HTML heat-map
is :mod:`treetune_verl.generation.heatmap`.

Importing this module warns; every old name still resolves to the same object in its new module. The new modules
are imported through ``importlib`` by name, only when a name is read: the generation layer comes after this one,
and only this alias reaches up to it.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_RECORDS = "treetune_verl.generation.records"
_HEATMAP = "treetune_verl.generation.heatmap"
# Old name -> the module it lives in now.
_MOVED = {
    "record_from_output": _RECORDS,
    "entropy_summary": _RECORDS,
    "format_table": _RECORDS,
    "write_jsonl": _RECORDS,
    "HEATMAP_RGB": _HEATMAP,
    "HEATMAP_CSS": _HEATMAP,
    "entropy_legend": _HEATMAP,
    "token_heatmap": _HEATMAP,
    "render_html": _HEATMAP,
}
__all__ = list(_MOVED)

warnings.warn(
    f"treetune_verl.sglang.report is deprecated and goes in 0.2: import from {_RECORDS} (records, table, JSONL) "
    f"or {_HEATMAP} (HTML heat-map)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MOVED))
