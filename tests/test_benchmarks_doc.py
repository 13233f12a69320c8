"""docs/benchmarks.md is rendered from the results files the benchmarks write
(``benchmarks/results/NAME.json``, by ``--write``): ``python benchmarks/render_docs.py
--check`` finds the page as its results files render it, and it fails where a figure on
the page was changed by hand or a results file lacks a key the page needs.

Regenerate the page after a benchmark's ``--write`` with
``python benchmarks/render_docs.py``."""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "benchmarks" / "results"
SCRIPT = ROOT / "benchmarks" / "render_docs.py"


def load_renderer():
    spec = importlib.util.spec_from_file_location("render_docs_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


render_docs = load_renderer()


def results_files() -> list[Path]:
    return sorted(RESULTS.glob("*.json"))


def test_the_page_is_what_its_results_files_render():
    """The committed page and results files agree, through the script's own command."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert render_docs.check(PAGE, RESULTS) == []


def test_every_results_file_names_its_benchmark_command_date_and_machine():
    files = results_files()
    assert files
    for path in files:
        data = json.loads(path.read_text())
        for key in ("benchmark", "command", "date", "machine", "results"):
            assert key in data, f"{path.name}: no {key!r}"
        script = ROOT / "benchmarks" / data["benchmark"]
        assert script.is_file(), path.name
        # the command runs that script (after an optional environment variable)
        assert re.fullmatch(rf"(\w+=\S+ )*python benchmarks/{re.escape(data['benchmark'])}"
                            r"( .*)?", data["command"]), data["command"]
        assert "--write" not in data["command"] and "--json-out" not in data["command"]
        assert re.match(r"\d{4}-\d{2}-\d{2}", data["date"]), data["date"]
        assert data["machine"]["nproc"] >= 1 and data["machine"]["cpu"]
        assert data.get("source") in (None, render_docs.TRANSCRIBED), path.name


def test_every_results_file_is_on_the_page_and_every_block_has_its_file():
    text = PAGE.read_text()
    blocks = re.findall(r"<!-- results:([\w-]+) -->", text)
    assert sorted(blocks) == sorted(render_docs.BLOCKS)
    used = set()
    for name in blocks:   # record which files each block reads
        render_docs.BLOCKS[name](lambda f: (used.add(f), render_docs.load(RESULTS, f))[1])
    assert used == {p.stem for p in results_files()}
    for name in used:   # the page names each file in a block's source line
        assert f"`benchmarks/results/{name}.json`" in text


def test_a_figure_changed_on_the_page_is_drift(tmp_path):
    page = tmp_path / "benchmarks.md"
    text = PAGE.read_text()
    start = text.index("<!-- results:throughput -->")
    end = text.index("<!-- /results:throughput -->")
    block = text[start:end]
    figure = re.search(r"\*\*([\d,]+)\*\*", block)
    edited = block.replace(figure[0], f"**{figure[1]}1**", 1)
    page.write_text(text[:start] + edited + text[end:])
    problems = render_docs.check(page, RESULTS)
    assert problems == ["block throughput: the page differs from its results files "
                        "(python benchmarks/render_docs.py rewrites it)"]
    # rendering puts the results files' figure back
    assert render_docs.render(page.read_text(), RESULTS) == text
    out = subprocess.run([sys.executable, str(SCRIPT), "--check", "--page", str(page)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1 and "block throughput" in out.stderr


@pytest.mark.parametrize("name, key", [("throughput", "env_steps_per_s"),
                                       ("population_throughput", "sync_over_single")])
def test_a_results_file_missing_a_key_the_page_needs_fails(tmp_path, name, key):
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    path = results / f"{name}.json"
    data = json.loads(path.read_text())
    del data["results"][key]
    path.write_text(json.dumps(data))
    problems = render_docs.check(PAGE, results)
    assert f"block {name}: benchmarks/results/{name}.json has no key 'results.{key}'" \
        in problems


def test_a_missing_results_file_or_header_key_fails(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    (results / "roofline.json").unlink()
    data = json.loads((results / "offline.json").read_text())
    del data["machine"]
    (results / "offline.json").write_text(json.dumps(data))
    problems = render_docs.check(PAGE, results)
    assert "block roofline: benchmarks/results/roofline.json is missing" in problems
    assert "block cost_model: benchmarks/results/roofline.json is missing" in problems
    assert "block offline: benchmarks/results/offline.json has no key 'machine'" in problems


def test_a_block_without_renderer_or_closing_marker_fails(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text(PAGE.read_text() + "\n<!-- results:nothing -->\nx\n<!-- /results:nothing -->\n"
                    "<!-- results:throughput -->\n")
    problems = render_docs.check(page, RESULTS)
    assert "block nothing: no renderer for the block 'nothing' (benchmarks/render_docs.py)" \
        in problems
    assert "1 results block(s) without their closing marker" in problems


def test_write_records_the_command_without_the_write_flags(tmp_path, monkeypatch):
    """``--write NAME`` / ``--json-out PATH``: the results file holds the command as run,
    less those flags, and the JSON the script prints under ``results``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import record
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-envs", type=int)
    ap.add_argument("overrides", nargs="*")
    record.add_arguments(ap, "x")
    argv = ["--num-envs", "8", "market.episode_length=5", "--json-out",
            str(tmp_path / "a.json"), "--write", "mine"]
    args = ap.parse_args(argv)
    assert args.write == "mine" and args.overrides == ["market.episode_length=5"]
    monkeypatch.setattr(record, "RESULTS_DIR", tmp_path / "results")
    results = {"env_steps_per_s": 12.5, "config": str(ROOT / "configs" / "bench_b.yaml"),
               "rows": [{"file": str(ROOT / "benchmarks" / "x.yaml")}]}
    paths = record.write(args, results, "benchmarks/throughput.py", argv, "throughput")
    assert paths == [tmp_path / "results" / "mine.json", tmp_path / "a.json"]
    for path in paths:
        data = json.loads(path.read_text())
        assert data["command"] == ("python benchmarks/throughput.py --num-envs 8 "
                                   "market.episode_length=5")
        assert data["benchmark"] == "throughput.py"
        # paths inside the repository are written relative to its root
        assert data["results"] == {"env_steps_per_s": 12.5, "config": "configs/bench_b.yaml",
                                   "rows": [{"file": "benchmarks/x.yaml"}]}
    args = ap.parse_args(["--write"])
    assert record.write(args, {}, "benchmarks/throughput.py", ["--write"], "throughput") == [
        tmp_path / "results" / "throughput.json"]


def test_the_cold_start_figure_is_the_median_pairs_and_every_pair_is_kept(tmp_path,
                                                                          monkeypatch):
    # Bug caught: benchmarks/calvano_cpu.py --pairs reporting the best pair (or the
    # last) instead of the median, or dropping pairs from the record; and the caches of
    # one pair reused by the next (its first run then not cold)
    spec = importlib.util.spec_from_file_location(
        "calvano_cpu_under_test", ROOT / "benchmarks" / "calvano_cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    walls = iter([39.0, 30.0, 33.0, 30.0, 45.0, 30.0])   # ratios 1.3, 1.1, 1.5
    caches = []

    def fake_product(sessions, run_dir, env=None):
        caches.append((env["JAXMARKET_COMPILE_CACHE"], env["NUMBA_CACHE_DIR"]))
        return {"wall_s": next(walls), "cpu_s": 1.0}

    monkeypatch.setattr(module, "product", fake_product)
    result = module.cold_and_warm(10, tmp_path, pairs=3)
    assert [p["cold_over_warm"] for p in result["pairs"]] == [1.3, 1.1, 1.5]
    assert result["cold_over_warm"] == 1.3 and result["cold"]["wall_s"] == 39.0
    assert result["target_met"] is (1.3 <= module.COLD_TARGET)
    assert caches[0] == caches[1] != caches[2] == caches[3] != caches[4] == caches[5]
