"""Packaging as a user meets it: the wheel carries every scenario file, an installed
wheel trains the default scenario from a directory that is not a checkout, shipped
``configs/NAME.yaml`` paths work anywhere, and ``jaxmarket --version`` is pyproject's
version."""

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS, ROOT

from jaxmarket.cli.main import main as jaxmarket_main
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import SHIPPED_CONFIGS, load_config

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def build_wheel(tmp_path: Path) -> Path:
    """``pip wheel --no-deps`` of a copy of the sources (setuptools builds in the source
    tree: a copy keeps the checkout clean and parallel runs apart)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "jaxmarket", src / "jaxmarket", symlinks=True, ignore=ignore)
    shutil.copytree(ROOT / "configs", src / "configs", ignore=ignore)
    out = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                           str(out), str(src)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    (path,) = out.glob("jaxmarket-*.whl")
    return path


def test_wheel_ships_the_configs_and_the_command_and_trains_outside_the_checkout(tmp_path):
    wheel = build_wheel(tmp_path)
    version = PYPROJECT["project"]["version"]
    assert wheel.name.startswith(f"jaxmarket-{version}-")
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n[len("jaxmarket/configs/"):]: zf.read(n) for n in zf.namelist()
                   if n.startswith("jaxmarket/configs/")}
        entry = zf.read(f"jaxmarket-{version}.dist-info/entry_points.txt").decode()
    # every scenario file, byte for byte, and the console script
    on_disk = {p.name: p.read_bytes() for p in CONFIGS.glob("*.yaml")}
    assert "budget_monopoly.yaml" in on_disk and shipped == on_disk
    assert "jaxmarket = jaxmarket.cli.main:console" in entry

    # installed on its own, it trains the default scenario from a directory that is not
    # the checkout, and finds the shipped configs there
    target, work = tmp_path / "site", tmp_path / "elsewhere"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                           "--target", str(target), str(wheel)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    script = ("import runpy, sys, jaxmarket\n"
              "print('imported', jaxmarket.__file__)\n"
              "print('calvano', jaxmarket.load_config('configs/calvano.yaml')['market']"
              "['distributor']['kind'])\n"
              "sys.argv = ['jaxmarket.train', 'train.num_iterations=20', 'train.chunk_size=10']\n"
              "runpy.run_module('jaxmarket.train', run_name='__main__')\n")
    env = {**os.environ, "PYTHONPATH": str(target)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the installed copy ran, not the checkout
    assert f"imported {target / 'jaxmarket' / '__init__.py'}" in proc.stdout
    assert "calvano logit" in proc.stdout
    (run_dir,) = (work / "runs").glob("budget_monopoly-*")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    shipped = yaml.safe_load((CONFIGS / "budget_monopoly.yaml").read_text())
    assert config["market"] == shipped["market"] and config["train"]["num_iterations"] == 20
    assert (run_dir / "summary.json").is_file()


def test_shipped_configs_resolve_from_any_directory_and_are_the_checkouts_files(
        tmp_path, monkeypatch):
    assert SHIPPED_CONFIGS.resolve() == CONFIGS.resolve()
    monkeypatch.chdir(tmp_path)
    assert load_config("configs/logit_duopoly.yaml") == load_config(CONFIGS / "logit_duopoly.yaml")
    # a file of that name in the working directory wins over the shipped one
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "logit_duopoly.yaml").write_text("market: {num_products: 7}\n")
    assert load_config("configs/logit_duopoly.yaml")["market"] == {"num_products": 7}
    with pytest.raises(ConfigError, match="an existing YAML file"):
        load_config("configs/no_such_scenario.yaml")


def test_console_script_prints_the_pyproject_version():
    script = Path(sys.executable).parent / "jaxmarket"
    proc = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"jaxmarket {PYPROJECT['project']['version']}"


def test_console_script_subcommands_delegate_to_the_modules(capsys):
    assert jaxmarket_main(["check", str(CONFIGS / "calvano.yaml")]) == 0
    out = capsys.readouterr().out
    assert "distributor: logit" in out
    # a configuration error keeps the shared CLI behaviour: one line, exit 2
    assert jaxmarket_main(["check", str(CONFIGS / "calvano.yaml"), "market.num_products=-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: market.num_products") and "\n" not in err
    # every command is the module's own CLI (its --help names it)
    for command in ("train", "check", "plot", "sweep", "collect", "offline", "record", "impulse"):
        with pytest.raises(SystemExit) as exc:
            jaxmarket_main([command, "--help"])
        assert exc.value.code == 0
        assert f"python -m jaxmarket.{command}" in capsys.readouterr().out, command
    with pytest.raises(SystemExit) as exc:
        jaxmarket_main(["fly"])
    assert exc.value.code == 2 and "invalid choice: 'fly'" in capsys.readouterr().err
