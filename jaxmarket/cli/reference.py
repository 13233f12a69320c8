"""``python -m jaxmarket.cli.reference [--write docs/fields.md]``: the reference of every
config field, generated from the ``Field`` tables the configs are validated against
(the market, its groups, every distributor, demand process, reward and observation
component, every learner kind and ``train:``): name, kind, default, allowed values and
doc. ``tests/test_fields_reference.py`` regenerates it and fails when
``docs/fields.md`` differs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

from jaxmarket.cli import plain
from jaxmarket.combinators.observations import OBSERVATIONS
from jaxmarket.combinators.rewards import REWARDS
from jaxmarket.config.fields import REQUIRED, Field
from jaxmarket.learners.base import LEARNERS
from jaxmarket.market.demand import DEMANDS
from jaxmarket.market.distributors import DISTRIBUTORS
from jaxmarket.market.spec import CONSUMER_FIELDS, MARKET_FIELDS, SELLER_FIELDS
from jaxmarket.train.config import TRAIN_FIELDS

HEAD = """# Config fields

Every field a config may set, with its default and what is allowed, generated from the
tables `python -m jaxmarket.check` validates against (regenerate with
`python -m jaxmarket.cli.reference --write docs/fields.md`; a test fails when this page
and the tables differ). What the fields mean together: [configuration.md](configuration.md).
"""


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(f: Field) -> str:
    if f.default is REQUIRED:
        return "required"
    if f.default is None:
        return "null"
    return f"`{f.default!r}`" if not isinstance(f.default, str) else f"`{f.default}`"


def table(fields: Mapping[str, Field], prefix: str) -> list[str]:
    """One Markdown table: a row per field."""
    if not fields:
        return ["(no settings)", ""]
    rows = ["| field | default | allowed | what |", "|---|---|---|---|"]
    for name, f in fields.items():
        rows.append(f"| `{prefix}{name}` | {_cell(_default(f))} | {_cell(f.describe())} | "
                    f"{_cell(f.doc)} |")
    return rows + [""]


def _kinds(title: str, registry: Mapping, prefix: str, fields_of) -> list[str]:
    out = [f"## {title}", ""]
    for kind in sorted(registry):
        out += [f"### `{kind}`", ""] + table(fields_of(registry[kind]), prefix)
    return out


def fields_markdown() -> str:
    """The page (module docstring)."""
    out = [HEAD, "## `market`", ""] + table(MARKET_FIELDS, "market.")
    out += ["## `market.consumers[i]`", ""] + table(CONSUMER_FIELDS, "market.consumers[i].")
    out += ["## `market.sellers[i]`", ""] + table(SELLER_FIELDS, "market.sellers[i].")
    out += _kinds("`market.distributor` by kind", DISTRIBUTORS, "market.distributor.",
                  lambda d: {**d.params, **d.options})
    out += _kinds("`market.consumers[i].demand` by kind", DEMANDS,
                  "market.consumers[i].demand.", lambda d: d.params)
    out += _kinds("Reward components by kind", REWARDS, "", lambda d: d.fields)
    out += _kinds("Observation components by kind", OBSERVATIONS, "", lambda d: d.fields)
    out += _kinds("`learners.<group>` by kind", LEARNERS, "learners.<group>.",
                  lambda d: d.hyper_fields)
    out += ["## `train`", ""] + table(TRAIN_FIELDS, "train.")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxmarket.cli.reference",
                                     description=plain(__doc__))
    parser.add_argument("--write", metavar="PAGE", default=None,
                        help="write the page there (default: print it)")
    args = parser.parse_args(argv)
    text = fields_markdown()
    if args.write is None:
        print(text, end="")
    else:
        Path(args.write).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
