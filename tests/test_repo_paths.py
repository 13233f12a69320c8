"""Docs, tests, code, benchmarks, configs and notebooks name only files of the repository:
no path into the sibling ``shared`` checkout beside it, no absolute path of one machine
(under the work, home or Users roots: see the patterns below), and every ``NAME.md``
they cite is a file of the repository."""

from __future__ import annotations

import os
import re
import subprocess

from conftest import ROOT

SCANNED = ("README.md", "docs", "tests", "jaxmarket", "benchmarks", "configs", "notebooks")
BINARY = (".png", ".svg", ".gif", ".jpg", ".jpeg", ".npz", ".npy", ".hdf5", ".h5", ".onnx",
          ".mp4", ".pdf")
# spelled in pieces so that this file does not match itself
SIBLING = re.compile(r"\.\./" + "shared" + r"\b")
ABSOLUTE = re.compile(r"(?<![\w.~:/-])/(?:" + "|".join(["wo" + "rk", "ho" + "me", "Us" + "ers"])
                      + r")/[\w.-]+")
MARKDOWN = re.compile(r"(?<![\w-])([\w-]+\.md)\b")


def repo_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files under the scanned paths."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                          "--", *SCANNED], cwd=ROOT, capture_output=True, text=True, check=True)
    return sorted(f for f in set(out.stdout.split())
                  if not f.endswith(BINARY) and (ROOT / f).is_file())


def texts() -> dict[str, str]:
    out = {}
    for f in repo_files():
        try:
            out[f] = (ROOT / f).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return out


def offenders(pattern: re.Pattern, files: dict[str, str]) -> list[str]:
    return [f"{f}:{t.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for f, t in files.items() for m in pattern.finditer(t)]


def test_the_scan_sees_the_docs_tests_code_and_benchmarks():
    files = repo_files()
    for expected in ("README.md", "docs/benchmarks.md", "tests/test_repo_paths.py",
                     "jaxmarket/adapters/gym_env.py", "benchmarks/minimal_step.py",
                     "configs/bench_b.yaml"):
        assert expected in files
    # and the patterns match what they are meant to
    assert SIBLING.search("python ../" + "shared/bench/x.py")
    assert ABSOLUTE.search("run /" + "work/venv/bin/python x")
    assert ABSOLUTE.search("see /" + "home/me/notes.md")
    assert not ABSOLUTE.search("docs/work/x.md") and not ABSOLUTE.search("https://a.b/work/x")
    assert MARKDOWN.findall("see docs/ground_truths.md and (design-notes.md)") == [
        "ground_truths.md", "design-notes.md"]


def test_no_file_names_a_sibling_checkout_or_an_absolute_machine_path():
    files = texts()
    bad = offenders(SIBLING, files) + offenders(ABSOLUTE, files)
    assert not bad, "paths outside the repository:\n" + "\n".join(bad)


def test_every_markdown_file_named_is_a_file_of_the_repository():
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    names = {os.path.basename(f) for f in tracked}
    files = {f: t for f, t in texts().items() if f != "tests/test_repo_paths.py"}  # examples
    bad = [b for b in offenders(MARKDOWN, files) if b.rsplit(": ", 1)[1] not in names]
    assert not bad, "markdown files that are not in the repository:\n" + "\n".join(bad)
