"""Every shipped scenario trains, and the docs say exactly what the shipped files hold:
the configs table lists every file with its learners, the tutorial's YAML is the
default file, every shell command in the docs quotes its bracketed overrides, and the
README opens with the two commands."""

import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import CONFIGS, ROOT

from jaxmarket.config.loader import load_config
from jaxmarket.market.spec import resolve_market
from jaxmarket.train.run import start_run
from jaxmarket.train.tracking import read_metrics

SHIPPED = sorted(p.stem for p in CONFIGS.glob("*.yaml"))
FEW = ["train.num_iterations=3", "train.chunk_size=3", "train.num_envs=4", "train.num_seeds=1"]


def quoted_price_bounds(config: dict, group: str) -> tuple[np.ndarray, np.ndarray]:
    """[P] bounds on the per-product mean over a group of the metric ``price/<group>``:
    sellers quote their price action, multiplier sellers multiplier x the first consumer's
    base price, consumer agents their budget."""
    spec, params = resolve_market(config["market"])
    g = spec.group(group)
    if g.side == "consumer":
        p = params.consumers[group]
        return p.budget_low.min(0), p.budget_high.max(0)
    p = params.sellers[group]
    low, high = p.low.min(0), p.high.max(0)
    if g.action == "multiplier":
        base = params.consumers[spec.consumers[0].name].base_price[0]
        low, high = low * base, high * base
    return low, high


def few(name: str) -> list[str]:
    """A few iterations of one seed; a population keeps its num_envs (K must divide it)."""
    learners = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text()).get("learners", {})
    if any(isinstance(c, dict) and "population" in c for c in learners.values()):
        return [o for o in FEW if not o.startswith("train.num_envs")]
    return FEW


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_trains(name, tmp_path):
    FEW = few(name)
    config = load_config(CONFIGS / f"{name}.yaml", FEW)
    assert "learners" in config, f"{name}.yaml has no learners: section"
    summary = start_run(str(CONFIGS / f"{name}.yaml"), FEW, str(tmp_path / "run"))
    header, data = read_metrics(tmp_path / "run" / "metrics.csv")
    np.testing.assert_array_equal(data[:, header.index("iteration")], [1, 2, 3])
    assert summary["stopped"] is None and summary["iterations"] == 3
    spec, _ = resolve_market(config["market"])
    for g in spec.agent_groups:
        assert np.all(np.isfinite(data[:, header.index(f"reward/{g.name}")]))
        low, high = quoted_price_bounds(config, g.name)
        # quantity sellers: their actions are the quantity/<g> column (price/<g> is the
        # clearing price, from 0 up to the demand intercept)
        column = "quantity" if g.action == "quantity" else "price"
        for j in range(spec.num_products):
            price = data[:, header.index(f"{column}/{g.name}/p{j}")]
            # actions are clipped to the group's bounds before the market sees them
            assert np.all(price >= low[j] - 1e-5) and np.all(price <= high[j] + 1e-5), \
                (g.name, j, price, low[j], high[j])


def test_configs_table_lists_every_shipped_file_with_its_learners():
    text = (ROOT / "docs" / "configs.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `configs/(\w+)\.yaml` \|.*$",
                                                        text, re.M)}
    assert sorted(rows) == SHIPPED
    for name, row in rows.items():
        learners = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["learners"]
        for group, spec in learners.items():
            assert f"{group}: `{spec['kind']}`" in row, (name, group)


def test_tutorial_yaml_is_the_shipped_default_file():
    text = (ROOT / "docs" / "tutorial.md").read_text()
    block = re.search(r"```yaml\n(market:.*?)```", text, re.S).group(1)
    assert yaml.safe_load(block) == yaml.safe_load((CONFIGS / "budget_monopoly.yaml").read_text())


def shell_commands(path: Path) -> list[str]:
    """Every ``python -m jaxmarket...`` command in a markdown file (code spans and blocks)."""
    return re.findall(r"python3? -m jaxmarket\.\w+[^`\n]*", path.read_text())


@pytest.mark.parametrize("path", [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))],
                         ids=lambda p: p.name)
def test_bracketed_overrides_in_docs_are_quoted(path):
    for command in shell_commands(path):
        words = re.findall(r"'[^']*'|\"[^\"]*\"|\S+", command)
        # an override indexing a list (sellers[0]) is a glob to zsh unless quoted
        unquoted = [w for w in words if re.search(r"\w\[\d+\]", w) and "=" in w
                    and w[0] not in "'\""]
        assert not unquoted, f"{path.name}: {command}"


def test_readme_starts_with_the_two_commands_on_python3():
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("```bash")
    first, second = lines[start + 1], lines[start + 2]
    assert lines[start + 3] == "```"
    for cmd in (first, second):
        assert cmd.startswith("python3 -m venv .venv && .venv/bin/pip install -e ")
    assert first.endswith(".venv/bin/python -m jaxmarket.train")
    assert "'.[test]'" in second and second.endswith("-m pytest -n 2 -m 'not slow'")
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'grep -m1 -E "pytest" README.md' in ci   # CI runs exactly the README's test line
    assert "pytest -n 2 -m slow" in ci              # and then the tests it leaves out
    assert "tests/test_clients.py" in ci            # and the outside clients
