"""``docs/fields.md`` is generated from the Field tables (``jaxmarket.cli.reference``):
the committed page equals a fresh generation, and it holds what the tables hold."""

import subprocess
import sys

from conftest import ROOT

from jaxmarket.cli.reference import fields_markdown
from jaxmarket.learners.base import LEARNERS
from jaxmarket.train.config import TRAIN_FIELDS


def test_the_committed_page_is_the_generated_one():
    # Bug caught: a field added, removed or re-documented without regenerating the page
    # (python -m jaxmarket.cli.reference --write docs/fields.md). Generated in a fresh
    # process: tests register kinds of their own in this one.
    fresh = subprocess.run([sys.executable, "-m", "jaxmarket.cli.reference"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    assert (ROOT / "docs" / "fields.md").read_text() == fresh


def test_every_train_field_and_learner_setting_has_its_row_with_its_default():
    # Bug caught: a table left out of the generator, or a default shown wrongly.
    page = fields_markdown()
    for name, f in TRAIN_FIELDS.items():
        assert f"| `train.{name}` |" in page, name
    row = next(line for line in page.splitlines() if line.startswith("| `train.engine` |"))
    assert "`auto`" in row and "'sessions'" in row
    for kind, definition in LEARNERS.items():
        assert f"### `{kind}`" in page
        for name in definition.hyper_fields:
            assert f"| `learners.<group>.{name}` |" in page, (kind, name)
