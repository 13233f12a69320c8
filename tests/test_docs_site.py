"""The documentation site: ``mkdocs build --strict`` (mkdocs-material, API reference by
mkdocstrings) succeeds, every page under docs/ is in the navigation, and the reference
page shows the documented functions with their docstrings."""

import os
import subprocess
import sys

import yaml
from conftest import ROOT


def nav_pages(nav) -> set[str]:
    out = set()
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            out |= nav_pages(value) if isinstance(value, list) else {value}
    return out


def test_mkdocs_strict_build_has_every_page_and_the_api_reference(tmp_path):
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert nav_pages(config["nav"]) == pages
    site = tmp_path / "site"
    # without -q: strict mode aborts on the warnings -q would keep from being logged
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-d", str(site)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = (site / "reference" / "index.html").read_text()
    for name in ("jaxmarket.make", "jaxmarket.adapters.make_parallel_env",
                 "jaxmarket.adapters.make_jaxmarl_env", "jaxmarket.market.env.MarketEnv",
                 "jaxmarket.market.economics.nash_price"):
        assert f'id="{name}"' in reference, name
    # docstring text, not just headings
    assert "dotted overrides" in reference and "ParallelEnv</code> of one market" in reference
    assert (site / "ecosystem" / "index.html").is_file() and (site / "index.html").is_file()
