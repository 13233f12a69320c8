"""The package's shape, read from its source with ``ast``: one-way layers, no import
cycles, jaxmarket-internal imports at module top, no function over 150 lines
(docs/architecture.md). Each check names the offending module, line and import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "jaxmarket"

# low to high; a module may import its own layer and the layers below it
LAYERS = [
    ("config", ("jaxmarket.config", "jaxmarket.compile_cache")),
    ("combinators", ("jaxmarket.combinators",)),
    ("market", ("jaxmarket.market",)),
    ("learners", ("jaxmarket.learners",)),
    ("models", ("jaxmarket.models",)),
    ("train", ("jaxmarket.train",)),
    ("sessions", ("jaxmarket.sessions",)),
    ("cluster", ("jaxmarket.cluster",)),
    ("analysis", ("jaxmarket.analysis",)),
    ("offline", ("jaxmarket.offline",)),
    ("adapters", ("jaxmarket.adapters",)),
    ("cli", ("jaxmarket.cli",)),
]
# offline and adapters are siblings: neither imports the other
SIBLINGS = {frozenset({"offline", "adapters"})}
# the python -m entry points and the package root sit above everything
TOP = ("jaxmarket", "jaxmarket.__main__")
MAX_LOCAL_IMPORTS = 10
MAX_FUNCTION_LINES = 150


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    if module in TOP or module.endswith(".__main__") or module.count(".") == 1 \
            and module.split(".")[1] in ENTRY_POINTS:
        return len(LAYERS)
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module}: in no layer of tests/test_architecture.py")


# python -m jaxmarket.NAME: one-screen modules that call into jaxmarket.cli
ENTRY_POINTS = ("check", "plot", "sweep", "collect", "record", "impulse", "reproduce")


def sources() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(ROOT.rglob("*.py"))}


def internal_imports(tree: ast.Module):
    """``(target, line, inside_function)`` for every import of a jaxmarket module."""
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "jaxmarket":
            targets = [node.module]
            if node.module == "jaxmarket":   # from jaxmarket import market -> jaxmarket.market
                targets = [f"jaxmarket.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.split(".")[0] == "jaxmarket"]
        else:
            continue
        for t in targets:
            yield t, node.lineno, id(node) in in_function


def resolve_target(target: str, modules: set[str]) -> str:
    """``from jaxmarket.x import name`` where ``name`` is not a module: ``jaxmarket.x``."""
    while target not in modules and "." in target:
        target = target.rsplit(".", 1)[0]
    return target


def upward_imports(trees: dict[str, ast.Module]) -> list[str]:
    """Every import of a higher layer, of the sibling layer or of the package root."""
    bad = []
    for module, tree in trees.items():
        for target, line, _ in internal_imports(tree):
            target = resolve_target(target, set(trees))
            lo, hi = layer(module), layer(target)
            names = {LAYERS[lo][0] if lo < len(LAYERS) else "top",
                     LAYERS[hi][0] if hi < len(LAYERS) else "top"}
            if target == "jaxmarket" and module not in TOP and lo < len(LAYERS):
                bad.append(f"{module}:{line} imports the package root (import the module)")
            elif len(names) == 2 and frozenset(names) in SIBLINGS:
                bad.append(f"{module}:{line} imports its sibling layer's {target}")
            elif hi > lo:
                bad.append(f"{module}:{line} imports {target} (layer {names})")
    return bad


def test_no_import_runs_upward_or_between_siblings():
    bad = upward_imports(sources())
    assert not bad, "\n".join(bad)


def import_cycles(trees: dict[str, ast.Module]) -> list[str]:
    """Every cycle of the import graph (local imports count: a cycle hidden inside
    function bodies is still a cycle)."""
    graph = {m: {resolve_target(t, set(trees)) for t, _, _ in internal_imports(tree)} - {m}
             for m, tree in trees.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m, path):
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t):] + [t]))
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_no_import_cycle():
    cycles = import_cycles(sources())
    assert not cycles, "\n".join(cycles)


def test_internal_imports_sit_at_module_top():
    local = [f"{m}:{line} imports {t}" for m, tree in sources().items()
             for t, line, inside in internal_imports(tree) if inside]
    assert len(local) <= MAX_LOCAL_IMPORTS, f"{len(local)} local imports:\n" + "\n".join(local)


def test_no_function_over_150_lines():
    long = [f"{m}:{n.lineno} {n.name}: {n.end_lineno - n.lineno + 1} lines"
            for m, tree in sources().items() for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "\n".join(long)


def test_the_checks_catch_an_upward_import_a_sibling_import_and_a_cycle():
    """The checkers on a made-up package: each one-line fault is named (a checker
    that resolved every module to one layer, or skipped local imports, would pass)."""
    parse = ast.parse
    upward = {"jaxmarket.market.env": parse("from jaxmarket.train.loop import make_train"),
              "jaxmarket.train.loop": parse("import jax")}
    assert upward_imports(upward) == [
        "jaxmarket.market.env:1 imports jaxmarket.train.loop (layer {'market', 'train'})"
        .replace("{'market', 'train'}", str({"market", "train"}))]
    sibling = {"jaxmarket.adapters.gym_env": parse("import jaxmarket.offline.fit"),
               "jaxmarket.offline.fit": parse("")}   # adapters sits above offline: still refused
    assert upward_imports(sibling) == ["jaxmarket.adapters.gym_env:1 imports its sibling "
                                       "layer's jaxmarket.offline.fit"]
    root = {"jaxmarket.learners.ppo": parse("from jaxmarket import make"), "jaxmarket": parse("")}
    assert upward_imports(root) == [
        "jaxmarket.learners.ppo:1 imports the package root (import the module)"]
    cycle = {"jaxmarket.offline.a": parse("from jaxmarket.offline.b import x"),
             "jaxmarket.offline.b": parse("def f():\n    from jaxmarket.offline.a import y")}
    assert import_cycles(cycle) == ["jaxmarket.offline.a -> jaxmarket.offline.b -> "
                                    "jaxmarket.offline.a"]
    assert upward_imports({"jaxmarket.train.loop": parse("from jaxmarket.market.env import E"),
                           "jaxmarket.market.env": parse("")}) == []
