"""The shape of the package: no module imports, directly or through others, a module that imports it
back; the leaves import nothing of podsrl's above them."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "podsrl"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """podsrl module -> the podsrl modules it imports (at any depth of its code, lazy imports too)."""
    mods = _modules()
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:  # podsrl.x.name -> podsrl.x
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_leaves_import_nothing_above_them():
    graph = import_graph()
    leaves = {
        "podsrl.errors": set(),
        "podsrl.grading.answers": set(),
        "podsrl.tasks.types": {"podsrl.errors"},
        "podsrl.engines.base": set(),
        "podsrl.intervals": set(),
    }
    for leaf, allowed in leaves.items():
        assert graph[leaf] <= allowed, f"{leaf} imports {sorted(graph[leaf] - allowed)}"
    core = {name for name in graph if name.startswith("podsrl.core")}
    for name in core:  # the math depends on nothing but itself
        assert graph[name] <= core | {"podsrl", "podsrl.errors"}, f"{name} imports {sorted(graph[name] - core)}"


def test_the_report_reads_no_training_code():
    """A report is built from a run's files, not from the training loop: what both need (the task a
    config names, its held-out problems) lives below both (podsrl.tasks.build); the printed table
    reads compare.json and the constants the report's math shares (podsrl.compare.stats), never the
    module that builds compare.json."""
    graph = import_graph()
    for name in ("podsrl.compare.report", "podsrl.compare.table", "podsrl.compare.stats", "podsrl.compare.plots"):
        training = sorted(m for m in graph[name] if m == "podsrl.train" or m.startswith("podsrl.train."))
        assert not training, f"{name} imports {training}"
    assert "podsrl.compare.report" not in graph["podsrl.compare.table"]
    assert {"podsrl.tasks.build"} <= graph["podsrl.train.loop"] & graph["podsrl.compare.report"]


# Functions that were split because they no longer read on one screen (issue 57), file -> names; a
# function split later joins the list.
SPLIT_FUNCTIONS = {
    "podsrl/core/loss.py": ("policy_loss",),
    "bench/gpu_check.py": ("update_worker",),
    "podsrl/compare/trl_arm/mapping.py": ("grpo_config",),  # issue 68: 65 lines, now one helper a group of settings
    "podsrl/compare/trl_arm/run.py": ("train_trl",),  # issue 68: 62 lines, now over podsrl.train.external
    "podsrl/compare/runs.py": ("_run_pool",),  # issue 68: 61 lines, now launch / reap
}
MAX_FUNCTION_LINES = 60
# Functions whose parameters were gathered into records (issue 68: evaluate took 11), file -> names.
GATHERED_PARAMETERS = {"podsrl/train/evaluate.py": ("evaluate",)}
MAX_PARAMETERS = 8


def test_split_functions_stay_on_one_screen():
    for file, names in SPLIT_FUNCTIONS.items():
        tree = ast.parse((ROOT.parent / file).read_text(encoding="utf-8"))
        lengths = {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        for name in names:
            assert lengths[name] <= MAX_FUNCTION_LINES, f"{file}: {name} is {lengths[name]} lines (at most {MAX_FUNCTION_LINES})"


def test_gathered_parameters_stay_few():
    for file, names in GATHERED_PARAMETERS.items():
        tree = ast.parse((ROOT.parent / file).read_text(encoding="utf-8"))
        counts = {node.name: len(node.args.args) + len(node.args.kwonlyargs) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        for name in names:
            assert counts[name] <= MAX_PARAMETERS, f"{file}: {name} takes {counts[name]} parameters (at most {MAX_PARAMETERS})"
