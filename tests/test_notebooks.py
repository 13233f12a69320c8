"""The notebooks in notebooks/ run top to bottom in their reduced mode
(JAXMARKET_QUICK=1), as CI runs them, from a directory that is not the checkout; the
repository keeps them without outputs, with the Colab set-up cell first."""

import re
import time

import nbformat
import pytest
from conftest import ROOT
from nbclient import NotebookClient

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def outputs_of(nb, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if kind in o.get("data", {}) or o.get("name") == kind]


def test_the_notebooks_are_there_stripped_and_start_with_the_colab_setup():
    assert [p.stem for p in NOTEBOOKS] == ["calvano_collusion", "offline_rl", "populations_pbt",
                                           "quickstart"]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.outputs == [] and c.execution_count is None for c in code), path.name
        setup = code[0].source
        assert "pip" in setup and "install" in setup and "jax.devices()" in setup, path.name
        assert 'os.environ.get("JAXMARKET_QUICK") == "1"' in setup, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_quick_mode(path, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXMARKET_QUICK", "1")
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    # any cell that raises fails the test (CellExecutionError), asserts in cells included;
    # the kernel starts in tmp_path, outside the checkout
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    seconds = time.perf_counter() - start
    text = "\n".join(o.get("text", "") for o in outputs_of(nb, "stdout"))
    # the set-up cell said where it runs, and nothing was installed: the checkout's
    # jaxmarket was importable
    assert "on CPU: 1 device(s)" in text and "jaxmarket 0.1" in text
    figures = outputs_of(nb, "image/png")
    expected = {"quickstart": 2, "calvano_collusion": 2, "populations_pbt": 2,
                "offline_rl": 2}[path.stem]
    assert len(figures) >= expected, (path.stem, len(figures))
    print(f"{path.stem}: {seconds:.1f} s")
    # what each notebook shows, from its printed results
    number = r"(-?\d+\.\d+)"
    if path.stem == "quickstart":      # the PPO bandit heads for the budget 0.5 from 1.0
        assert 0.3 < float(re.search(rf"learned price {number}", text)[1]) < 0.55
    elif path.stem == "calvano_collusion":   # supra-competitive: above random play (~0.5)
        assert 0.6 < float(re.search(rf"profit gain Delta = {number}", text)[1]) < 1.0
    elif path.stem == "populations_pbt":     # PBT's population ends at the monopoly price
        assert abs(float(re.search(rf"final mean price {number}", text)[1]) - 1.802) < 0.05
    elif path.stem == "offline_rl":          # IQL beats the logged heuristic, in the simulator
        behaviour, learned = map(float, re.search(rf"behaviour {number} -> IQL {number}", text)
                                 .groups())
        assert learned > behaviour + 0.2
