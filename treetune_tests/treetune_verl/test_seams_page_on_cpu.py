# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The architecture page's seams table against the code's ``Wrap``s and ``Replace``s: no patch of upstream without
its row, no row that names a hook nothing patches, no patch of upstream outside the two.

Read from the source (``ast``: no sglang or verl import, so it runs on both stacks): every ``Wrap(target, "attr",
...)`` and ``Replace(owner, "attr", ...)`` of the package, by module (a ``Replace`` of a mapping's entries whose key
is not a literal counts under the mapping's name: ``agent_loop._agent_loop_registry``). A page row
(``agent-docs/architecture.md``, "Seams") names its owner module and, in its seam column, the upstream attributes;
outside parentheses, each of those must be a ``Wrap`` or ``Replace`` of that module, unless the row is a seam of
another named kind, written in the row itself: a subclass of an upstream class (``subclass``), a class verl loads by
name (``by name``), an entry point (``entry point``), an attribute swapped for one call (``patching.swapped``).
And no module sets an attribute of an imported sglang or verl object, mutates one of its containers or swaps an
object's ``__class__`` outside those mechanisms (the six raw replacements this found are ``Replace``s or gone).
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
UPSTREAM_PACKAGES = ("sglang", "verl")
# Calls that change a container in place, when made on an upstream module's attribute (``mod._registry.update``).
MUTATORS = ("setdefault", "update", "append", "extend", "insert", "pop", "__setitem__")


def code_wraps() -> set[tuple[str, str]]:
    """(module path relative to the package, attribute) of every ``Wrap(target, "attribute", ...)`` and
    ``Replace(owner, "attribute", ...)`` call."""
    wraps = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Wrap", "Replace"):
                owner, attribute = (node.args + [None, None])[:2]
                if isinstance(attribute, ast.Constant) and isinstance(attribute.value, str):
                    wraps.add((module, attribute.value))
                elif node.func.id == "Replace" and isinstance(owner, ast.Attribute):
                    wraps.add((module, owner.attr))  # a mapping's entries, under the mapping's name
                else:
                    raise AssertionError(
                        f"{module}:{node.lineno}: {node.func.id}'s attribute is not a string literal: this test "
                        f"cannot read it"
                    )
    return wraps


def _upstream_names(tree: ast.AST) -> set[str]:
    """The names a module binds to sglang or verl objects by importing them (at any depth)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.split(".")[0] in UPSTREAM_PACKAGES
            }
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in UPSTREAM_PACKAGES:
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def raw_replacements(source: str, module: str) -> list[str]:
    """Where ``source`` changes upstream outside ``Wrap`` / ``Replace``: an attribute of an imported sglang or verl
    object set (``mod.attr = ...``, ``setattr(mod, ...)``), one of its containers changed in place, an object's
    ``__class__`` swapped."""
    tree = ast.parse(source, module)
    upstream = _upstream_names(tree)
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and sub.attr == "__class__":
                    found.append(f"{module}:{node.lineno}: {ast.unparse(sub)} = (a class swap)")
                elif (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.ctx, ast.Store)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id in upstream
                ):
                    found.append(f"{module}:{node.lineno}: {ast.unparse(sub)} =")
                elif isinstance(sub, ast.Subscript) and isinstance(sub.ctx, ast.Store):
                    base = sub.value
                    while isinstance(base, ast.Attribute):
                        base = base.value
                    if isinstance(base, ast.Name) and base.id in upstream:
                        found.append(f"{module}:{node.lineno}: {ast.unparse(sub)} =")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Name) and first.id in upstream:
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            base = node.func.value
            if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id in upstream:
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return found


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
        found.append(f"Wrap or Replace of {attribute!r} in {module} has no row naming it in the seams table")
    for upstream, seam, owner in rows:
        if not (PACKAGE / owner).is_file():
            found.append(f"row {upstream!r}: owner {owner} is not a module of the package")
        if any(kind in seam for kind in OTHER_KINDS):
            continue
        names = named_attributes(seam)
        if not names:
            found.append(f"row {upstream!r} ({owner}): names no upstream attribute")
        for name in names:
            if (owner, name) not in wraps:
                found.append(
                    f"row {upstream!r}: {name!r} is no Wrap or Replace of {owner} (nor a seam of another named kind)"
                )
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
        "Wrap or Replace of '_validate' in verl/v0_7_1/trainer_seams.py has no row naming it in the seams table",
        "row 'verl `RayPPOTrainer`': 'compute_advantage' is no Wrap or Replace of verl/v0_7_1/trainer_seams.py (nor a "
        "seam of another named kind)",
        "row 'verl `AgentLoopWorker`': owner agent_loop/no_such_module.py is not a module of the package",
    ]
    with pytest.raises(AssertionError, match="not one module path"):
        page_rows(page.replace("`agent_loop/entropy_worker.py`", "entropy_worker"))


def test_no_module_patches_upstream_outside_wrap_and_replace():
    found = [
        problem
        for path in sorted(PACKAGE.rglob("*.py"))
        for problem in raw_replacements(path.read_text(), path.relative_to(PACKAGE).as_posix())
    ]
    assert found == []


def test_the_raw_replacement_check_finds_each_kind():
    """Negative controls: the six raw replacements the package had before ``Replace`` (their shapes), and what it
    must leave alone (our own objects' attributes, a local dict, a ``Replace``)."""
    source = """
import copy
from sglang.srt.entrypoints import engine as engine_mod
from verl.experimental.agent_loop import agent_loop

def install(ours, client):
    from sglang.srt.managers import tokenizer_manager as tm
    engine_mod.run_scheduler_process = ours
    setattr(tm, "_INCREMENTAL_STREAMING_META_INFO_KEYS", ())
    agent_loop._agent_loop_registry.setdefault("x", {})
    agent_loop._agent_loop_registry["y"] = {}
    named = copy.copy(client)
    named.__class__ = type(ours)
    ours.entropy_config = 1
    local = {}
    local["z"] = 1
    Replace(engine_mod, "run_scheduler_process", lambda _: ours, lambda _: None, why="entry point")
"""
    assert raw_replacements(source, "m.py") == [
        "m.py:8: engine_mod.run_scheduler_process =",
        "m.py:11: agent_loop._agent_loop_registry['y'] =",
        "m.py:13: named.__class__ = (a class swap)",
        "m.py:9: setattr(tm, '_INCREMENTAL_STREAMING_META_INFO_KEYS', ())",
        "m.py:10: agent_loop._agent_loop_registry.setdefault('x', {})",
    ]
