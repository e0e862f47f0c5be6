# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The package's import graph points one way along the entropy's path, has no cycle, and every module imports alone.

The graph is read from the source (every ``import`` statement, including those inside functions, which run later
but still tie the modules together), so a test fails the moment someone adds a forbidden edge, whether or not the
code path runs here. Layers, lowest first: the sglang side knows nothing of verl; the verl side's server
(``rollout``) imports the sglang side; the agent loops import both; the probe stands alone (only the forecast, which
runs it inside verl's actor, imports it). The fresh-import
test then imports each module on its own (in a child forked from an interpreter holding only third-party packages),
which catches what static reading cannot (an import that only works when another of our modules happened to be
imported first).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import treetune_verl

PACKAGE_DIR = Path(treetune_verl.__file__).resolve().parent
ROOT = "treetune_verl"

# Sub-packages in path order: a module may import its own layer and the layers before it, never a later one.
LAYERS = [
    "treetune_verl.sglang",
    "treetune_verl.rollout",
    "treetune_verl.ppo",
    "treetune_verl.forecast",  # the live entropy forecast: the probe inside verl's actor worker
    "treetune_verl.control",  # entropy control from the forecast: the decision of one update
    "treetune_verl.trainer",  # every hook in verl's trainer and actor processes: one seam per upstream hook
    "treetune_verl.agent_loop",
    "treetune_verl.verl",  # what differs between verl versions: one folder per version, picked through one table
    "treetune_verl.managed",  # chat-style agent sessions over the engine or verl's agent loops
    "treetune_verl.generation",  # dataset-scale generation job (in-process Engine or verl's agent-loop manager)
    "treetune_verl.analysis",  # reads what generation (or `make run`) wrote
    "treetune_verl.examples",  # complete examples a user copies (an environment over managed sessions)
]
# Stand-alone sub-packages: import nothing of the layers above (and the layers never import them).
STANDALONE = ["treetune_verl.probe"]
# The exceptions: layers that may import a stand-alone sub-package (the forecast and the controller run the probe's
# teacher forcing in verl's actor).
STANDALONE_USERS = {
    "treetune_verl.forecast": {"treetune_verl.probe"},
    "treetune_verl.control": {"treetune_verl.probe"},  # the controller's own forwards and backward on E
}
# Shared leaves anyone may import; they import nothing of ours.
LEAVES = {
    "treetune_verl",
    "treetune_verl.model_cache",
    "treetune_verl.config",
    "treetune_verl.patching",
    "treetune_verl.verl_guard",
    "treetune_verl.batch_keys",
    "treetune_verl.timing",
    "treetune_verl.log_level",
    "treetune_verl.lazy_exports",
}
# Third-party packages a layer must not import: the sglang side stays usable without verl.
FORBIDDEN_THIRD_PARTY = {"treetune_verl.sglang": {"verl"}, "treetune_verl.probe": {"verl", "sglang"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


MODULES = package_modules()


def imported_names(path: Path, name: str) -> set[str]:
    """Absolute names of everything ``path`` imports (``from a import b`` gives ``a.b`` when that is a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                names.add(candidate if candidate in MODULES else source)
        elif isinstance(node, ast.Call) and _called_name(node.func) == "import_module" and node.args:
            if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                names.add(node.args[0].value)  # an import by name is an import (importlib.import_module("a.b"))
        elif isinstance(node, ast.Dict) and node.values:
            values = [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            if len(values) == len(node.values) and all(value in MODULES for value in values):
                names.update(values)  # a lazy-export table (lazy_exports.py): name -> the module it imports
    return names


def _called_name(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def internal_graph() -> dict[str, set[str]]:
    """Edges between our own modules; an import of ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for imported in imported_names(path, name):
            if imported == ROOT or imported.startswith(ROOT + "."):
                parts = imported.split(".")
                for i in range(1, len(parts) + 1):
                    prefix = ".".join(parts[:i])
                    if prefix in MODULES and prefix != name and not name.startswith(prefix + "."):
                        targets.add(prefix)
        graph[name] = targets
    return graph


def owner(module: str) -> str:
    for group in LAYERS + STANDALONE:
        if module == group or module.startswith(group + "."):
            return group
    if module in LEAVES or module.startswith("treetune_verl.config."):
        return "leaf"
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS, STANDALONE or LEAVES in this test")


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in graph.items():
        src = owner(module)
        for target in targets:
            dst = owner(target)
            if dst == "leaf" or dst == src:
                continue
            if src == "leaf":
                bad.append(f"{module} (a shared leaf) imports {target}")
            elif dst in STANDALONE_USERS.get(src, ()):
                continue
            elif src in STANDALONE or dst in STANDALONE:
                bad.append(f"{module} imports {target}: {STANDALONE} stand alone")
            elif LAYERS.index(dst) > LAYERS.index(src):
                bad.append(f"{module} ({src}) imports {target} ({dst}), a later layer")
    return sorted(bad)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_every_module_belongs_to_a_layer():
    for module in MODULES:
        owner(module)


def test_imports_point_one_way_along_the_path():
    assert layering_violations(internal_graph()) == []


def test_no_import_cycle():
    assert find_cycle(internal_graph()) is None


def test_no_forbidden_third_party_imports():
    bad = []
    for module, path in MODULES.items():
        for group, forbidden in FORBIDDEN_THIRD_PARTY.items():
            if module == group or module.startswith(group + "."):
                bad += [f"{module} imports {n}" for n in imported_names(path, module) if n.split(".")[0] in forbidden]
    assert bad == []


def test_the_checks_catch_a_backward_edge_and_a_cycle():
    """The two checks above would fail on the mistakes they guard against (checked on a copy of the real graph)."""
    graph = {module: set(targets) for module, targets in internal_graph().items()}
    graph["treetune_verl.sglang.entropy"].add("treetune_verl.agent_loop.recorder")
    assert layering_violations(graph) == [
        "treetune_verl.sglang.entropy (treetune_verl.sglang) imports treetune_verl.agent_loop.recorder "
        "(treetune_verl.agent_loop), a later layer"
    ]
    graph = {module: set(targets) for module, targets in internal_graph().items()}
    graph["treetune_verl.sglang.config"].add("treetune_verl.sglang.entropy")  # entropy imports config
    assert find_cycle(graph) is not None


def test_imports_inside_functions_are_read(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from treetune_verl.agent_loop import recorder\n")
    assert "treetune_verl.agent_loop.recorder" in imported_names(source, "treetune_verl.sglang.m")


def test_imports_by_name_and_lazy_export_tables_are_read(tmp_path):
    """An import by a string (how the removed ``ppo/actor_setup.py`` alias reached the trainer layer past this test)
    and a lazy-export table count as imports; a dict of other strings does not."""
    source = tmp_path / "m.py"
    source.write_text(
        "import importlib\n"
        "def f():\n    return importlib.import_module('treetune_verl.verl.process_setup')\n"
        "_WHERE = {'EntropyRecorder': 'treetune_verl.agent_loop.recorder'}\n"
        "TEXT = {'a': 'treetune_verl.not_a_module', 'b': 'x'}\n"
    )
    names = imported_names(source, "treetune_verl.ppo.m")
    assert {"treetune_verl.verl.process_setup", "treetune_verl.agent_loop.recorder"} <= names
    assert "treetune_verl.not_a_module" not in names
    graph = {"treetune_verl.ppo.advantage": {"treetune_verl.verl.process_setup"}}
    assert layering_violations(graph) == [
        "treetune_verl.ppo.advantage (treetune_verl.ppo) imports treetune_verl.verl.process_setup "
        "(treetune_verl.verl), a later layer"
    ]


# What one upstream version needs lives in that version's folder (``sglang/v0_5_12/``, ``verl/v0_9_1/``, ...): a module
# named for a version (``*_v0_9_1``, ``*_tq`` for verl 0.9.1's TransferQueue trainer) anywhere else is a second
# convention for the same axis.
VERSION_FOLDER = re.compile(r"^treetune_verl\.(sglang|verl)\.v\d+_\d+_\d+\w*(\.|$)")
VERSION_SUFFIX = re.compile(r"(_v\d+_\d+(_\d+)?|_tq)$")
# The agent loops run below the trainer's seams; what they take from the trainer layer is its feature list and metrics.
AGENT_LOOP_TO_TRAINER_MAX = 2


def version_suffixed_modules(modules) -> list[str]:
    """Modules outside a version folder whose name carries a version."""
    return sorted(m for m in modules if not VERSION_FOLDER.match(m) and VERSION_SUFFIX.search(m.rsplit(".", 1)[-1]))


def agent_loop_to_trainer(graph: dict[str, set[str]]) -> set[str]:
    """The trainer-layer modules the agent-loop layer imports."""
    return {
        target
        for module, targets in graph.items()
        if owner(module) == "treetune_verl.agent_loop"
        for target in targets
        if owner(target) == "treetune_verl.trainer"
    }


def test_no_version_suffix_outside_the_version_folders():
    assert version_suffixed_modules(MODULES) == []
    assert version_suffixed_modules(["treetune_verl.agent_loop.worker_tq", "treetune_verl.verl.v0_9_1.worker"]) == [
        "treetune_verl.agent_loop.worker_tq"
    ]
    assert version_suffixed_modules(["treetune_verl.forecast.loop_v0_9_1", "treetune_verl.sglang.v0_5_12.launch"]) == [
        "treetune_verl.forecast.loop_v0_9_1"
    ]


def test_the_agent_loops_take_little_from_the_trainer_layer():
    imported = agent_loop_to_trainer(internal_graph())
    assert len(imported) <= AGENT_LOOP_TO_TRAINER_MAX, sorted(imported)
    graph = {
        "treetune_verl.agent_loop.a": {f"treetune_verl.trainer.{m}" for m in ("features", "metrics", "custom_keys")}
    }
    assert len(agent_loop_to_trainer(graph)) == 3  # the check counts modules, not arrows


def test_one_version_switch():
    """Which verl version runs is decided in one place (``treetune_verl.verl.adapter``): no module branches on it."""
    switch = re.compile(r"\bon_current_stack\b|installed_verl_version\(\) *(==|!=|in)|version\(\"verl\"\) *(==|!=|in)")
    branching = [m for m, path in MODULES.items() if switch.search(path.read_text())]
    assert branching == []
    assert switch.search("if on_current_stack():") and switch.search('if version("verl") == "0.9.1":')


# The sglang side and the agent loops must not pull sglang's heavy import into processes that do not need it: every
# agent-loop worker process unpickles our classes (Ray pickles by module).
NO_SGLANG_IMPORT = [
    "treetune_verl.agent_loop",
    "treetune_verl.verl",  # what differs between verl versions: one folder per version, picked through one table
    "treetune_verl.trainer",
    "treetune_verl.batch_keys",
    "treetune_verl.rollout.token_output",
    "treetune_verl.probe",
    "treetune_verl.managed",
    "treetune_verl.analysis",
]


FORK_SERVER = Path(__file__).with_name("import_fork_server.py")
# Two imports whose outcome is known, run beside ours: the fork server reports a failed import and a pulled-in sglang.
NO_SUCH_MODULE = "treetune_verl.no_such_module"
SGLANG = "sglang"


@pytest.fixture(scope="module")
def fresh_imports() -> dict[str, dict]:
    """Every module's import alone, each in a child forked from one fresh interpreter that holds only third-party
    packages (``import_fork_server.py``: none of ours, no sglang): ``{module: {"returncode", "stdout", "stderr"}}``.
    One interpreter per module cost minutes of CI on 2 cores, most of it importing torch and verl again."""
    modules = sorted(MODULES) + [NO_SUCH_MODULE, SGLANG]
    result = subprocess.run(
        [sys.executable, str(FORK_SERVER), *modules], capture_output=True, text=True, timeout=900, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_fork_server_reports_a_failed_import_and_sglang(fresh_imports):
    missing = fresh_imports[NO_SUCH_MODULE]
    assert missing["returncode"] == 1 and f"No module named '{NO_SUCH_MODULE}'" in missing["stderr"]
    assert fresh_imports[SGLANG]["returncode"] == 0, fresh_imports[SGLANG]["stderr"][-3000:]
    assert fresh_imports[SGLANG]["stdout"].strip().splitlines()[-1] == "True"


# Modules of one verl only (the block's manager per stack): under another verl their import refuses, naming it.
VERL_ONLY = {
    "treetune_verl.verl.v0_9_1.entropy_manager": "0.9.1",
    "treetune_verl.verl.v0_9_1.entropy_tool_agent_loop": "0.9.1",
    "treetune_verl.verl.v0_9_1.forecast_eval_worker": "0.9.1",
    "treetune_verl.verl.v0_9_1.over_sample_worker": "0.9.1",
    "treetune_verl.verl.v0_9_1.resuming_client": "0.9.1",
    "treetune_verl.verl.v0_9_1.session_rows_worker": "0.9.1",
    "treetune_verl.verl.v0_9_1.worker": "0.9.1",
    "treetune_verl.verl.v0_9_1.over_sample_sampler": "0.9.1",
    "treetune_verl.verl.v0_7_1.entropy_tool_agent_loop": "0.7.1",
    "treetune_verl.verl.v0_7_1.entropy_manager": "0.7.1",
    "treetune_verl.verl.v0_7_1.over_sample_worker": "0.7.1",
    "treetune_verl.verl.v0_7_1.session_server_manager": "0.7.1",
    "treetune_verl.verl.v0_7_1.worker": "0.7.1",
    "treetune_verl.verl.v0_7_1.generation_rollout": "0.7.1",
    "treetune_verl.verl.v0_9_1.generation_rollout": "0.9.1",
}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_imports_in_a_fresh_interpreter(module, fresh_imports):
    result = fresh_imports[module]
    stderr = result["stderr"][-3000:]
    if module in VERL_ONLY and importlib.metadata.version("verl") != VERL_ONLY[module]:
        assert result["returncode"] != 0 and "UnsupportedVerlError: treetune_verl's" in stderr, stderr
        assert f"support verl {VERL_ONLY[module]}" in stderr, stderr
        return
    assert result["returncode"] == 0, f"import {module} failed in a fresh interpreter:\n{stderr}"
    if module in NO_SGLANG_IMPORT:
        assert result["stdout"].strip().splitlines()[-1] == "False", f"importing {module} imported sglang"


REPO_ROOT = PACKAGE_DIR.parent


def test_architecture_page_and_readme_name_every_module_and_folder():
    """The map in agent-docs/architecture.md names every module; the README layout table names every package folder."""
    page = (REPO_ROOT / "agent-docs" / "architecture.md").read_text()
    missing = [
        str(path.relative_to(PACKAGE_DIR))
        for path in MODULES.values()
        if path.stem not in {"__init__", "__main__"} and f"{path.name}`" not in page
    ]
    assert missing == [], f"agent-docs/architecture.md does not name: {missing}"
    readme = (REPO_ROOT / "README.md").read_text()
    folders = sorted(
        {path.parent for path in MODULES.values() if path.parent != PACKAGE_DIR and path.name == "__init__.py"}
    )
    unnamed = [str(f.relative_to(REPO_ROOT)) for f in folders if f"`{f.relative_to(REPO_ROOT)}/`" not in readme]
    unnamed = [f for f in unnamed if not f.startswith("treetune_verl/probe/config")]  # inside probe/
    assert unnamed == [], f"README.md's layout table does not name: {unnamed}"


def documented_layers(page: str) -> list[str]:
    """The numbered layer list under "## Layers" of the architecture page, lowest first."""
    section = page.split("## Layers", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. `(treetune_verl\.[a-z_]+)`", section, flags=re.MULTILINE)


def test_the_architecture_page_lists_the_enforced_layers():
    """The layers a reader is told about are the ones this test enforces, in the same order."""
    page = (REPO_ROOT / "agent-docs" / "architecture.md").read_text()
    assert documented_layers(page) == LAYERS
    standalone = page.split("## Layers", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{module}`" in standalone for module in STANDALONE)
    leaves = {f"`{m.removeprefix(ROOT + '.').replace('.', '/')}.py`" for m in LEAVES - {ROOT, "treetune_verl.config"}}
    assert all(leaf in standalone for leaf in leaves), leaves
    assert documented_layers("## Layers\n\n1. `treetune_verl.a` — x\n2. `treetune_verl.b` — y\n\n## Next\n") == [
        "treetune_verl.a",
        "treetune_verl.b",
    ]
