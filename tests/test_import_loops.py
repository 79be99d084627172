"""No import loop inside workshop_lib, counting imports inside functions (DESIGN.md: imports point down the flow).

An edge A -> B is any `import`/`from ... import` in A that names B, at module level or inside a function;
`if TYPE_CHECKING:` blocks are not run and do not count. Importing a.b.c also runs a/__init__.py and a/b/__init__.py,
so an importer outside a package gets an edge to each package __init__ on the way (a package's own modules do not:
Python has already started that __init__). A loop is named with the line of each edge, so the fix is easy to find.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

from repo_paths import REPO

PACKAGE = REPO / "workshop_lib"
# Loops allowed to remain: none since issue 26 (a new one fails the test with the line of each edge).
KNOWN_LOOPS = ()


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _targets(module: str, node: ast.AST, modules: dict[str, Path]) -> list[str]:
    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    if isinstance(node, ast.Import):
        return [found for alias in node.names if (found := known(alias.name))]
    if node.level:
        base = module.split(".")
        if modules[module].name != "__init__.py":
            base = base[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [found for alias in node.names if (found := known(f"{source}.{alias.name}"))]


@functools.cache  # parsed once for all the tests here
def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first import}."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        def visit(node: ast.AST) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    visit(ast.Module(body=child.orelse, type_ignores=[]))  # an import right under else counts
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _targets(name, child, modules):
                        chain = target.split(".")
                        for depth in range(2, len(chain) + 1):  # the package __init__s it runs on the way
                            step = ".".join(chain[:depth])
                            if step != name and step in modules and not name.startswith(step + "."):
                                graph[name].setdefault(step, child.lineno)
                visit(child)
        visit(ast.parse(path.read_text(), str(path)))
    return graph


def loops(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_workshop_lib_has_no_import_loop():
    graph, paths = import_graph(), _modules()
    found = loops(graph)
    problems = [f"no longer a loop, strike it from KNOWN_LOOPS: {known}" for known in KNOWN_LOOPS
                if list(known) not in found]
    for group in found:
        if tuple(group) in KNOWN_LOOPS:
            continue
        edges = [f"{a} -> {b} ({paths[a].relative_to(PACKAGE.parent)}:{line})"
                 for a in group for b, line in sorted(graph[a].items()) if b in group]
        problems.append("loop: " + ", ".join(group) + "\n    " + "\n    ".join(edges))
    assert not problems, "\n".join(problems)


def test_train_imports_only_core_and_itself():
    """Job-side code never imports the notebook side (DESIGN.md): train/ reads core/ and itself only.

    One exception: the class rehearsal's stand-in job fakes a run from the experiment's shape, so it reads the
    experiment matrix (standard library only, like core/)."""
    graph = import_graph()
    allowed = {("workshop_lib.train.rehearsal", "workshop_lib.experiments"),
               ("workshop_lib.train.rehearsal", "workshop_lib.experiments.experiment"),
               ("workshop_lib.train.rehearsal", "workshop_lib.experiments.matrix")}
    outside = {(a, b) for a, targets in graph.items() if a.startswith("workshop_lib.train")
               for b in targets if not b.startswith(("workshop_lib.train", "workshop_lib.core"))} - allowed
    assert not outside, sorted(outside)


def test_nothing_outside_train_imports_it():
    """train/ is the job side: only train/ imports it (DESIGN.md). The layer test below cannot say so, because train
    is not one of workshop_lib.LAYERS (it skips every edge into train); this one does, function-level imports
    included (sites/requirements.py once imported train.models inside hub_models)."""
    graph, paths = import_graph(), _modules()
    inside = [f"{a} -> {b} ({paths[a].relative_to(PACKAGE.parent)}:{line})" for a, targets in sorted(graph.items())
              if not a.startswith("workshop_lib.train") for b, line in sorted(targets.items())
              if b.startswith("workshop_lib.train")]
    assert not inside, ("imports of workshop_lib.train from outside it; move the shared fact into core/ "
                        "instead:\n" + "\n".join(inside))


def test_core_is_standard_library():
    """core/ imports only the standard library and itself, at module level or in a function: the memory calculator
    ships it to the browser and train/ reads it inside jobs (see core/__init__.py)."""
    outside = []
    for name, path in _modules().items():
        if not name.startswith("workshop_lib.core"):
            continue
        for node in _run_imports(ast.parse(path.read_text(), str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [] if node.level else [node.module or ""]
            outside += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {found}" for found in names
                        if found.split(".")[0] not in sys.stdlib_module_names | {"__future__", "workshop_lib"}]
    assert not outside, "core/ must stay standard library:\n" + "\n".join(outside)


def _run_imports(node: ast.AST):
    """Every import statement that runs: module level and inside functions, not under `if TYPE_CHECKING:`."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
        return
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for other in child.orelse:
                yield from _run_imports(other)
            continue
        yield from _run_imports(child)


def test_core_imports_nothing_of_the_library():
    graph = import_graph()
    outside = {(a, b) for a, targets in graph.items() if a.startswith("workshop_lib.core")
               for b in targets if not b.startswith("workshop_lib.core")}
    assert not outside, sorted(outside)


def test_checks_import_only_what_lies_below_them():
    """checks/ (see its __init__) reads core, experiments, estimate and the site profiles, never what comes
    downstream of it (scripts, jobs, runs, results, book, widgets, cli)."""
    below = ("workshop_lib.checks", "workshop_lib.core", "workshop_lib.experiments", "workshop_lib.estimate",
             "workshop_lib.sites.profiles", "workshop_lib.sites.schema", "workshop_lib.sites")
    graph = import_graph()
    outside = {(a, b) for a, targets in graph.items() if a.startswith("workshop_lib.checks")
               for b in targets if not b.startswith(below)}
    assert not outside, sorted(outside)


def test_imports_point_down_the_layers():
    """workshop_lib/__init__.py lists the packages in the order of the flow; a package imports only those above it
    in that list (itself included). The one exception: the chapter facade shows the live job monitor."""
    from workshop_lib import LAYERS

    allowed = {("workshop_lib.book.chapter.facade", "workshop_lib.widgets")}
    graph, paths = import_graph(), _modules()
    unplaced, upward = [], []
    for module, targets in graph.items():
        parts = module.split(".")
        if module in ("workshop_lib", "workshop_lib.site_check") or parts[1] == "train":
            continue
        if parts[1] not in LAYERS:
            unplaced.append(module)
            continue
        for target, line in targets.items():
            layer = target.split(".")[1] if "." in target else None
            if layer in LAYERS and LAYERS.index(layer) > LAYERS.index(parts[1]) and \
                    (module, ".".join(target.split(".")[:2])) not in allowed:
                upward.append(f"{module} -> {target} ({paths[module].relative_to(PACKAGE.parent)}:{line})")
    assert not unplaced, f"modules outside every package of workshop_lib.LAYERS: {unplaced}"
    assert not upward, "imports pointing up the layers:\n" + "\n".join(upward)
