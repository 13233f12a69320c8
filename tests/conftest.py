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
# the CLIs' persistent compilation cache (jaxmarket/compile_cache.py) stays off in tests
# unless a test asks for one: no writes to ~/.cache, and every test compiles as it did
os.environ.setdefault("JAXMARKET_COMPILE_CACHE", "none")
sys.path.insert(0, str(ROOT / "tests"))
