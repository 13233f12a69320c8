"""Uniform sample of a group's mutants (seed 0); print the unchecked ones to run.

    ../../.venv/bin/python ../../tools/mutation/sample.py GROUP N [--status]   (cwd: .mutation/GROUP)
"""
import json
import random
import sys
from pathlib import Path

from mutmut.configuration import config
from mutmut.mutation.file_mutation import mutate_file_contents

group, n = sys.argv[1], int(sys.argv[2])
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
sample = sorted(random.Random(0).sample(sorted(names), min(n, len(names))))
if "--all-survivors" in sys.argv:   # every checked mutant that survived / timed out
    print(" ".join(m for m in sorted(names) if status.get(m) in (0, 36)))
elif "--status" in sys.argv:
    codes = [status.get(m) for m in sample]
    from collections import Counter
    print(len(names), "mutants;", "sample", len(sample), Counter(codes))
else:
    print(" ".join(m for m in sample if status.get(m) is None))
