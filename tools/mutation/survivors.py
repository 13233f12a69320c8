"""Show the diffs of the surviving (or given-status) mutants of the seed-0 sample."""
import json
import random
import subprocess
import sys
from pathlib import Path

from mutmut.configuration import config
from mutmut.mutation.file_mutation import mutate_file_contents

n = int(sys.argv[1]); want = {int(x) for x in sys.argv[2].split(",")} if len(sys.argv) > 2 else {0}
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
for m in sample:
    if status.get(m) in want:
        out = subprocess.run(["../../.venv/bin/mutmut", "show", m], capture_output=True, text=True, check=False).stdout
        diff = [l for l in out.splitlines() if l[:1] in "+-" and not l.startswith(("+++", "---"))]
        print("==", m.split(".")[-1], status.get(m)); print("\n".join(diff))
