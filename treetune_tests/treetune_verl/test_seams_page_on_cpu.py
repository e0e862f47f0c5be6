# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The architecture page's seams table against the code's ``Wrap``s: no patch of upstream without its row, no row
that names a hook nothing patches.

Read from the source (``ast``: no sglang or verl import, so it runs on both stacks): every ``Wrap(target, "attr",
...)`` of the package, by module. A page row (``agent-docs/architecture.md``, "Seams") names its owner module and, in
its seam column, the upstream attributes; outside parentheses, each of those must be a ``Wrap`` of that module, unless
the row is a seam of another named kind, written in the row itself: a subclass of an upstream class (``subclass``),
a class verl loads by name (``by name``), an entry point (``entry point``), an attribute swapped for one call
(``patching.swapped``), or one of :data:`RAW_REPLACEMENTS` (listed here with why each is not a ``Wrap``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "treetune_verl"
PAGE = ROOT / "agent-docs" / "architecture.md"
# Seams of other kinds than a Wrap, as a row says them (in its seam column).
OTHER_KINDS = ("subclass", "by name", "entry point", "patching.swapped")
# Upstream attributes replaced outside ``Wrap`` (owner module, attribute): why each is not one.
RAW_REPLACEMENTS = {
    # sglang 0.5.6.post2 spawns the scheduler by this module attribute: ours is a whole entry point (a replacement,
    # not a wrapper: nothing of the original runs), checked by ``launch.is_installed``
    ("sglang/v0_5_6_post2/launch.py", "run_scheduler_process"),
    # a tuple of key names sglang 0.5.12 slices when streaming: our key appended (data, not a callable)
    ("sglang/v0_5_12/tokenizer_hooks.py", "_INCREMENTAL_STREAMING_META_INFO_KEYS"),
}


def code_wraps() -> set[tuple[str, str]]:
    """(module path relative to the package, attribute) of every ``Wrap(target, "attribute", ...)`` call."""
    wraps = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Wrap":
                attribute = node.args[1] if len(node.args) > 1 else None
                assert isinstance(attribute, ast.Constant) and isinstance(attribute.value, str), (
                    f"{module}:{node.lineno}: Wrap's attribute is not a string literal: this test cannot read it"
                )
                wraps.add((module, attribute.value))
    return wraps


def page_rows(page: str) -> list[tuple[str, str, str]]:
    """(upstream, seam, owner) of each row of the page's seams table."""
    section = page.split("## Seams", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0].startswith("upstream") or set(cells[0]) <= {"-"}:
            continue
        owner = re.fullmatch(r"`([\w/.]+\.py)`", cells[2])
        assert owner, f"seams table: the owner cell {cells[2]!r} is not one module path in backticks"
        rows.append((cells[0], cells[1], owner.group(1)))
    return rows


def named_attributes(seam: str) -> list[str]:
    """The backticked names of a seam cell outside parentheses (``Class.attr`` counts as ``attr``)."""
    outside = re.sub(r"\([^)]*\)", "", seam)
    return [name.rsplit(".", 1)[-1] for name in re.findall(r"`([\w.]+)`", outside)]


def problems(wraps: set[tuple[str, str]], rows: list[tuple[str, str, str]]) -> list[str]:
    found = []
    listed = {(owner, name) for _, seam, owner in rows for name in named_attributes(seam)}
    for module, attribute in sorted(wraps - listed):
        found.append(f"Wrap of {attribute!r} in {module} has no row naming it in the seams table")
    for upstream, seam, owner in rows:
        if not (PACKAGE / owner).is_file():
            found.append(f"row {upstream!r}: owner {owner} is not a module of the package")
        if any(kind in seam for kind in OTHER_KINDS):
            continue
        names = named_attributes(seam)
        if not names:
            found.append(f"row {upstream!r} ({owner}): names no upstream attribute")
        for name in names:
            if (owner, name) not in wraps and (owner, name) not in RAW_REPLACEMENTS:
                found.append(f"row {upstream!r}: {name!r} is no Wrap of {owner} (nor a seam of another named kind)")
    return found


def test_every_wrap_has_its_row_and_every_row_its_wrap():
    wraps = code_wraps()
    assert len(wraps) >= 40, f"only {len(wraps)} Wraps read: the reader misses some"
    assert problems(wraps, page_rows(PAGE.read_text())) == []


def test_the_check_fails_on_a_missing_row_and_on_a_row_without_a_wrap():
    """Negative controls: a Wrap the page forgot, a row whose hook nothing patches, an owner that does not exist."""
    wraps = {("verl/v0_7_1/trainer_seams.py", "_validate"), ("verl/v0_7_1/trainer_seams.py", "extract_reward")}
    page = (
        "## Seams\n\n| upstream | seam | owner | features |\n|---|---|---|---|\n"
        "| verl `ray_trainer` | `extract_reward` | `verl/v0_7_1/trainer_seams.py` | x |\n"
        "| verl `RayPPOTrainer` | `compute_advantage` | `verl/v0_7_1/trainer_seams.py` | y |\n"
        "| verl `AgentLoopWorker` | `_postprocess` (subclass) | `agent_loop/no_such_module.py` | z |\n"
        "| verl `AgentLoopWorker` | `generate_sequences` (a subclass) | `agent_loop/entropy_worker.py` | w |\n"
        "\n## Next\n"
    )
    assert problems(wraps, page_rows(page)) == [
        "Wrap of '_validate' in verl/v0_7_1/trainer_seams.py has no row naming it in the seams table",
        "row 'verl `RayPPOTrainer`': 'compute_advantage' is no Wrap of verl/v0_7_1/trainer_seams.py (nor a seam of "
        "another named kind)",
        "row 'verl `AgentLoopWorker`': owner agent_loop/no_such_module.py is not a module of the package",
    ]
    with pytest.raises(AssertionError, match="not one module path"):
        page_rows(page.replace("`agent_loop/entropy_worker.py`", "entropy_worker"))
