"""The house by pipeline stage, held by a test.

Layers, from the top: cli -> roles (agent, collector, record) -> assembly
(session, stacks, export, flamegraph) -> stages (kernel, symbols, encode,
config) -> vocabulary (model, abi, errors, metrics, httpserve, cache,
proto). An import never goes up a layer, a role never imports another
role (the collector never imports agent code), the packages' import graph
has no cycle, and tests import shared helpers from tests/support only.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

from tests.support import ROOT, TESTS

PACKAGE = ROOT / "daemon" / "ember"

LAYERS: dict[str, int] = {
    **dict.fromkeys(("__init__", "abi", "model", "errors", "metrics", "httpserve", "cache",
                     "proto", "bpf"), 0),
    **dict.fromkeys(("kernel", "unwind", "symbols", "runtimes", "encode", "config"), 1),
    **dict.fromkeys(("session", "stacks", "threads", "export", "flamegraph"), 2),
    **dict.fromkeys(("agent", "collector", "record"), 3),
    "cli": 4,
}
LAYER_NAMES = ("vocabulary", "stage", "assembly", "role", "cli")
ROLES = {name for name, layer in LAYERS.items() if layer == 3}


def unit_of(module: str) -> str:
    """The top-level module or package of ember.x.y ('x')."""
    return module.split(".")[1] if "." in module else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every ember import in a file, wherever it
    stands (functions and TYPE_CHECKING blocks included)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("ember"):
                    yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("ember"):
                continue
            if target == "ember" or not node.module or node.level:
                # `from . import x`: each name may be a module of its own
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    found = any((PACKAGE.parent / (sub.replace(".", "/") + s)).exists()
                                for s in (".py", "/__init__.py"))
                    yield node.lineno, sub if found else target
            else:
                yield node.lineno, target


def sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "proto" not in p.parts)


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(module_name(p)) for p in sources()}
    assert units <= set(LAYERS), f"give these a layer: {sorted(units - set(LAYERS))}"


def test_no_import_goes_up_a_layer_or_across_roles() -> None:
    bad = []
    for path in sources():
        src = unit_of(module_name(path))
        for line, target in imports(path):
            dst = unit_of(target)
            if dst == src:
                continue
            where = f"{path.relative_to(ROOT)}:{line} imports {target}"
            if LAYERS[dst] > LAYERS[src]:
                bad.append(f"{where}: {src} ({LAYER_NAMES[LAYERS[src]]}) may not import "
                           f"{dst} ({LAYER_NAMES[LAYERS[dst]]})")
            elif src in ROLES and dst in ROLES:
                bad.append(f"{where}: one role imports another")
    assert not bad, "\n".join(bad)


def test_the_package_graph_has_no_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for path in sources():
        src = unit_of(module_name(path))
        graph.setdefault(src, set()).update(
            dst for _, t in imports(path) if (dst := unit_of(t)) != src)
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join([*trail, node, nxt]))
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_tests_share_helpers_only_through_support() -> None:
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        if "fixtures" in path.parts or "support" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else ["." * node.level + (node.module or "")]
                     if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name.startswith(".") or (name.startswith("tests") and not (
                        name == "tests.support" or name.startswith("tests.support."))):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not bad, "\n".join(bad)


def test_every_package_is_shipped() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {module_name(p.parent / "__init__.py") for p in PACKAGE.rglob("__init__.py")}
    assert found - listed == set(), "add to [tool.setuptools] packages in pyproject.toml"


def test_at_most_twelve_top_level_modules_and_none_over_500_lines() -> None:
    top = [p for p in PACKAGE.glob("*.py")]
    assert len(top) <= 12, sorted(p.name for p in top)
    long = [f"{p.relative_to(ROOT)}: {n}" for p in sources()
            if (n := len(p.read_text().splitlines())) > 500]
    assert not long, long
