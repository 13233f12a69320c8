"""Docs that are exactly true: every ```python block of the docs runs from the repository
root, and where a ``print(...)`` is followed by comment lines (``# ...``), those lines are
what it prints."""

import ast
import io
import os
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from conftest import ROOT

DOCS = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def python_blocks(path: Path) -> list[tuple[int, str]]:
    text = path.read_text()
    out = []
    for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        out.append((text[:m.start()].count("\n") + 2, m.group(1)))
    return out


BLOCKS = [(path, line, code) for path in DOCS for line, code in python_blocks(path)]


def expected_prints(code: str) -> dict[int, str]:
    """line of a top-level ``print(...)`` -> the comment lines right after it, unprefixed."""
    lines = code.splitlines()
    out = {}
    for node in ast.parse(code).body:
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "print":
            comments = []
            for line in lines[node.end_lineno:]:
                if not line.startswith("#"):
                    break
                comments.append(line[2:] if line.startswith("# ") else line[1:])
            if comments:
                out[node.lineno] = "\n".join(comments)
    return out


@pytest.mark.parametrize("path, line, code", BLOCKS,
                         ids=[f"{p.relative_to(ROOT)}:{n}" for p, n, _ in BLOCKS])
def test_python_block_runs_and_prints_what_its_comments_say(path, line, code, monkeypatch):
    monkeypatch.chdir(ROOT)
    expected = expected_prints(code)
    printed: dict[int, list[str]] = {}
    builtin_print = print

    def recording_print(*args, **kwargs):
        frame = sys._getframe(1)
        if frame.f_code.co_filename == "<doc>":
            buf = io.StringIO()
            builtin_print(*args, **{**kwargs, "file": buf})
            printed.setdefault(frame.f_lineno, []).append(buf.getvalue().rstrip("\n"))
        builtin_print(*args, **kwargs)

    namespace = {"__name__": "__doc_example__", "print": recording_print}
    with redirect_stdout(io.StringIO()):
        exec(compile(code, "<doc>", "exec"), namespace)
    for lineno, text in expected.items():
        got = printed.get(lineno)
        assert got is not None, f"{path.name}:{line + lineno - 1}: the print did not run"
        assert matches(got[-1], text), (f"{path.name}:{line + lineno - 1}", got[-1], text)


def matches(printed: str, expected: str) -> bool:
    """doctest's ELLIPSIS rule: ``...`` in the expected text stands for anything; a
    trailing ``  (remark)`` after two spaces annotates the output and is not part of it."""
    lines = [re.sub(r"\s{2,}\(.*\)$", "", ln) for ln in expected.splitlines()]
    pattern = ".*".join(re.escape(part) for part in "\n".join(lines).split("..."))
    return re.fullmatch(pattern, printed, re.S) is not None


def test_every_doc_page_is_linked_from_the_readme_or_another_page():
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    text = "\n".join(p.read_text() for p in DOCS)
    linked = set(re.findall(r"\]\((?:docs/)?([\w/]+\.md)", text))
    linked |= {f"learners/{x}" for x in re.findall(r"\]\(learners/([\w]+\.md)", text)}
    missing = sorted(pages - linked - {p for p in pages for q in linked if q.endswith(p)})
    assert not missing, missing



def test_every_image_and_relative_link_in_the_docs_exists():
    """Catches a figure or page renamed or never committed."""
    broken = []
    for page in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken



os.environ.setdefault("JAX_PLATFORMS", "cpu")
