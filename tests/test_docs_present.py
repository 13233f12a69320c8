"""The documentation states the present: a page is reference or tutorial, never a history
of how the code got there (no "before | after" tables, no "used to", no "what changed"),
and the README's documentation list links every page of docs/."""

from __future__ import annotations

import re

from conftest import ROOT

# phrases that narrate history, matched case-insensitively outside code blocks: a
# "before | after" table, "used to", "what changed", "after the <refactor>", ...
HISTORY = [re.compile(p, re.IGNORECASE | re.MULTILINE) for p in (
    r"\bused to\b", r"\bbefore\s*\|", r"\|\s*before\s*(?:\||$)", r"\bwhat changed\b",
    # "after the <noun>" is ordinary order-of-events wording ("after the run", "after the
    # step"); these uses of it tell a history
    r"\bafter the (?:[\w-]+ )?(?:refactor|change|rewrite|fix|speed work)\b",
    r"\bprevious kernel\b", r"\bno longer\b", r"\bwas changed\b", r"\bwe changed\b",
    r"\bas before\b")]


def pages() -> list:
    return sorted((ROOT / "docs").rglob("*.md"))


def prose(text: str) -> str:
    """The page without its fenced code blocks (a command's output may say anything)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def history_phrases(text: str) -> list[str]:
    body = prose(text)
    return [m.group(0) for pattern in HISTORY for m in pattern.finditer(body)]


def test_the_history_check_catches_history_and_passes_the_present():
    assert history_phrases("a run of many markets used to cost minutes") == ["used to"]
    assert "before |" in history_phrases("| size | before | after |")
    assert history_phrases("| size | after | before") == ["| before"]
    assert history_phrases("## What changed\n") == ["What changed"]
    assert history_phrases("The time after the run-assembly refactor") == [
        "after the run-assembly refactor"]
    assert history_phrases("### Previous kernel (two sorts)") == ["Previous kernel"]
    assert history_phrases("it averages as before") == ["as before"]
    # order of events is not history, nor is anything inside a code block
    assert history_phrases("rows after the checkpoint are dropped; the state before the step") == []
    assert history_phrases("| `obs` | before the step (before an auto-reset) |") == []
    assert history_phrases("```\nold: used to be\n```\nplain text") == []


def test_no_doc_page_narrates_history():
    bad = {p.relative_to(ROOT).as_posix(): found
           for p in pages() if (found := history_phrases(p.read_text()))}
    assert not bad, bad


def readme_documentation_links() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"\]\((docs/[\w/.-]+\.md)(?:#[^)]*)?\)", section))


def test_the_readme_documentation_list_links_every_docs_page():
    want = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    want |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "learners").glob("*.md")}
    linked = readme_documentation_links()
    assert "docs/tutorial.md" in linked and "docs/learners/ppo.md" in linked
    assert not want - linked, sorted(want - linked)
    assert not linked - want, sorted(linked - want)   # and only pages that exist
