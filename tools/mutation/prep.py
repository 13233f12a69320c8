"""Build a mutmut working copy for one module group: ``.mutation/<group>/`` (ignored by git).

    .venv/bin/python tools/mutation/prep.py env   # then: tools/mutation/chain.sh env 100

Why a copy, and what it changes there (never in the repository):

* the copy is a snapshot of the tracked + untracked-but-not-ignored files, so other
  people's edits to the checkout do not race with mutmut's ``mutants/`` tree;
* ``@partial(jax.jit, ...)``-decorated functions are rewritten to an undecorated ``def``
  followed by ``name = partial(jax.jit, ...)(name)`` (the same object at run time):
  mutmut 3 never mutates decorated functions, which would leave ``isa._allocate``,
  ``isa_greedy._allocate`` and ``MarketEnv.step/reset`` out;
* ``tests/conftest.py`` gets a hook that calls ``jax.clear_caches()`` before every test
  during mutmut's stats run only: mutmut maps tests to functions by trampoline hits,
  and a jit cache hit skips tracing (no hit), so without it a function would be
  associated only with the first test that traced it;
* ``[tool.mutmut]`` of the copy's pyproject.toml is replaced by the group's settings,
  with ``process_isolation = "forkserver"`` and ``forkserver_warmup = "import"`` of a
  list of heavy modules that do not initialise the XLA backend (forking a process in
  which the backend is initialised deadlocks; importing gymnax initialises it).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

KILLS = "tests/test_mutation_kills.py"
GROUPS = {
    "env": (["jaxmarket/market/env.py"],
            ["tests/test_env.py", "tests/test_observation_joins.py", "tests/test_loop_joins.py",
             "tests/test_single_agent.py", "tests/test_isa_quality.py", KILLS]),
    "combinators": (["jaxmarket/combinators/*"],
                    ["tests/test_combinators.py", "tests/test_observation_joins.py",
                     "tests/test_config.py", KILLS]),
    "isa": (["jaxmarket/market/distributors/isa*.py"],
            ["tests/test_distributors.py", "tests/test_isa_quality.py",
             "tests/test_distributor_properties.py", KILLS, "-k", "isa"]),
    "train": (["jaxmarket/train/*"],
              ["tests/test_train.py", "tests/test_loop_joins.py", KILLS]),
    # the train: config and the trackers
    "train_config": (["jaxmarket/train/config.py", "jaxmarket/train/tracking.py"],
                     ["tests/test_train.py", "tests/test_cli.py", KILLS]),
}

PRELOAD = """jax
jax.numpy
numpy
scipy
scipy.stats
matplotlib
matplotlib.pyplot
seaborn
flax
flax.struct
optax
chex
distrax
tensorflow_probability
orbax.checkpoint
hypothesis
yaml
rich
sacred
tensorboardX
pytest
"""

CONFTEST_HOOK = '''

# --- added by tools/mutation/prep.py (mutmut working copy only) ---
def pytest_runtest_setup(item):
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        import jax
        jax.clear_caches()
'''


def undecorate_jit(path: Path) -> int:
    """Rewrite ``@partial(jax.jit, ...)`` / ``@jax.jit`` defs as def + assignment."""
    src = path.read_text()
    lines = src.splitlines(keepends=True)
    edits = []  # (decorator_start, decorator_end, func_end, indent, name, wrapper)
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.FunctionDef) or len(node.decorator_list) != 1:
            continue
        dec = node.decorator_list[0]
        text = ast.get_source_segment(src, dec)
        if not (text.startswith("partial(jax.jit") or text == "jax.jit"):
            continue
        indent = " " * node.col_offset
        edits.append((dec.lineno - 1, dec.end_lineno, node.end_lineno, indent, node.name, text))
    for start, end, fend, indent, name, text in sorted(edits, reverse=True):
        lines.insert(fend, f"{indent}{name} = {text}({name})\n")
        del lines[start:end]
    path.write_text("".join(lines))
    return len(edits)


def main(group: str) -> None:
    mutate, tests = GROUPS[group]
    dest = ROOT / ".mutation" / group
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    keep = dest / "mutants"  # keep mutmut's results between runs
    for child in dest.glob("*") if dest.exists() else []:
        if child != keep:
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    for f in files:
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    tests = [t for i, t in enumerate(tests) if t.startswith("-") or (i and tests[i - 1] == "-k")
             or (dest / t).exists()]
    n = 0
    for pattern in mutate:
        for p in sorted(dest.glob(pattern)):
            if p.suffix == ".py":
                n += undecorate_jit(p)
    conftest = dest / "tests" / "conftest.py"
    conftest.write_text(conftest.read_text() + CONFTEST_HOOK)
    (dest / "preload_modules.txt").write_text(PRELOAD)
    pyproject = dest / "pyproject.toml"
    text = re.sub(r"\n\[tool\.mutmut\]\n(?:(?!\[).*\n?)*", "\n", pyproject.read_text())
    q = lambda xs: "[" + ", ".join(f'"{x}"' for x in xs) + "]"
    text += f"""
[tool.mutmut]
source_paths = ["jaxmarket"]
also_copy = ["configs", "docs", "benchmarks", "preload_modules.txt"]
only_mutate = {q(mutate)}
pytest_add_cli_args_test_selection = {q(tests)}
pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "no:xdist"]
process_isolation = "forkserver"
forkserver_warmup = "import"
preload_modules_file = "preload_modules.txt"
use_git_change_detection = false
"""
    pyproject.write_text(text)
    print(f"{dest}: {len(files)} files, {n} jit decorators unwrapped, tests {tests}")


if __name__ == "__main__":
    main(sys.argv[1])
