import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


@pytest.fixture
def configs() -> Path:
    return CONFIGS


def duopoly_config(**market_overrides) -> dict:
    """The logit duopoly scenario as a mapping (tests tweak it in place)."""
    import yaml
    config = yaml.safe_load((CONFIGS / "logit_duopoly.yaml").read_text())
    config["market"].update(market_overrides)
    return config


os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One JAX compilation cache for the whole test run, shared by the xdist workers and the
# CLI subprocesses the tests start (they inherit the environment), and used by the CLIs'
# own cache (jaxmarket/compile_cache.py; nothing is written to ~/.cache): a program that
# one test compiled (a run that another test resumes, a config that several files train)
# is loaded by the next instead of compiled again. A loaded program is the executable
# that was compiled, so every result is the same bits. The directory goes at the end.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile
    _TEST_CACHE: str | None = tempfile.mkdtemp(prefix="jaxmarket-test-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _TEST_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")
    os.environ.setdefault("JAXMARKET_COMPILE_CACHE", _TEST_CACHE)
else:   # an xdist worker: the controller made it (or the caller chose one)
    _TEST_CACHE = None
    os.environ.setdefault("JAXMARKET_COMPILE_CACHE", os.environ["JAX_COMPILATION_CACHE_DIR"])


def pytest_sessionfinish(session, exitstatus):
    if _TEST_CACHE is not None and not hasattr(session.config, "workerinput"):
        import shutil
        shutil.rmtree(_TEST_CACHE, ignore_errors=True)


sys.path.insert(0, str(ROOT / "tests"))
