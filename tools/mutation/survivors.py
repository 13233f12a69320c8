"""Show the diffs of the surviving (or given-status) mutants of the seed-0 sample."""
import subprocess
import sys

from mutants import mutants, sample

n = int(sys.argv[1]); want = {int(x) for x in sys.argv[2].split(",")} if len(sys.argv) > 2 else {0}
names, status = mutants()
picked = sample(names, n)
for m in picked:
    if status.get(m) in want:
        out = subprocess.run(["../../.venv/bin/mutmut", "show", m], capture_output=True, text=True, check=False).stdout
        diff = [l for l in out.splitlines() if l[:1] in "+-" and not l.startswith(("+++", "---"))]
        print("==", m.split(".")[-1], status.get(m)); print("\n".join(diff))
