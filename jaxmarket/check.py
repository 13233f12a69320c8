"""``python -m jaxmarket.check CONFIG [key=value ...]``: print the resolved scenario
(groups, shapes, kinds, parameters) or the configuration error (exit code 2)."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from jaxmarket.cli import run_cli
from jaxmarket.config.loader import load_config
from jaxmarket.market.spec import resolve_market, thaw


def _fmt(x) -> str:
    a = np.asarray(x)
    if a.size and np.all(a == a.ravel()[0]):
        return f"{a.ravel()[0]:g} (all of shape {list(a.shape)})"
    return np.array2string(a, precision=4, separator=", ").replace("\n", " ")


def describe(config: dict) -> str:
    spec, params = resolve_market(config["market"])
    lines = [f"market: {spec.num_products} product(s), {spec.num_consumers} consumer(s), "
             f"{spec.num_sellers} seller(s); episode_length: "
             f"{'never' if params.episode_length == 2**31 - 1 else int(params.episode_length)}",
             f"distributor: {spec.distributor}"]
    for k, v in params.distributor.items():
        lines.append(f"  {k}: {_fmt(v)}")
    for k, v in (thaw(spec.distributor_options) or {}).items():
        lines.append(f"  {k}: {v}")
    for g in spec.groups:
        role = f"agents, action={g.action}" if g.agent else "entities"
        lines.append(f"{g.side} group {g.name!r}: count={g.count} ({role}), "
                     f"arrays [{g.count}, {spec.num_products}]")
        p = (params.sellers if g.side == "seller" else params.consumers)[g.name]
        for field in p.__dataclass_fields__:
            value = getattr(p, field)
            if field == "demand":
                lines.append(f"  demand: {g.demand_kind} " + ", ".join(
                    f"{k}={_fmt(v)}" for k, v in value.items()))
            else:
                lines.append(f"  {field}: {_fmt(value)}")
        if g.agent:
            lines.append(f"  reward: {thaw(g.reward)}")
            lines.append(f"  observation: {thaw(g.observation) or '[] (none: bandit)'}")
    for section in ("learners", "train"):
        if section in config:
            lines.append(f"{section}: {config[section]}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxmarket.check", description=__doc__)
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    args = parser.parse_args(argv)
    config = load_config(args.config, args.overrides)
    text = describe(config)
    _check_rest(config)
    print(text)
    return 0


def _check_rest(config: dict) -> None:
    """Validate the learners/train sections too when the training package is present."""
    try:
        from jaxmarket.train.config import resolve_training
    except ImportError:
        return
    resolve_training(config)


if __name__ == "__main__":
    sys.exit(run_cli(main))
