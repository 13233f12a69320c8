"""The mutants of a ``.mutation/GROUP`` working copy (cwd) and their mutmut status, and
the seed-0 uniform sample of them that ``sample.py`` and ``survivors.py`` share."""
import json
import random
from pathlib import Path

from mutmut.configuration import config
from mutmut.mutation.file_mutation import mutate_file_contents


def mutants() -> tuple[list[str], dict[str, int]]:
    """``(names, status)``: every mutant's name (``module.mutant``) and the exit code of
    those mutmut has checked (1 killed, 0 survived, 36 timed out)."""
    names, status = [], {}
    for p in sorted(Path("jaxmarket").rglob("*.py")):
        if not config().should_mutate(p):
            continue
        module = ".".join(p.with_suffix("").parts)
        r = mutate_file_contents(str(p), p.read_text())
        names += [f"{module}.{m}" for m in r.mutant_names]
        meta = Path("mutants") / (str(p) + ".meta")
        if meta.exists():
            status.update(json.loads(meta.read_text())["exit_code_by_key"])
    return names, status


def sample(names: list[str], n: int) -> list[str]:
    """A uniform sample of ``n`` mutant names, ``random.Random(0)`` on the sorted names."""
    return sorted(random.Random(0).sample(sorted(names), min(n, len(names))))
