"""Uniform sample of a group's mutants (seed 0); print the unchecked ones to run.

    ../../.venv/bin/python ../../tools/mutation/sample.py GROUP N [--status]   (cwd: .mutation/GROUP)
"""
import sys

from mutants import mutants, sample

group, n = sys.argv[1], int(sys.argv[2])
names, status = mutants()
picked = sample(names, n)
if "--all-survivors" in sys.argv:   # every checked mutant that survived / timed out
    print(" ".join(m for m in sorted(names) if status.get(m) in (0, 36)))
elif "--status" in sys.argv:
    codes = [status.get(m) for m in picked]
    from collections import Counter
    print(len(names), "mutants;", "sample", len(picked), Counter(codes))
else:
    print(" ".join(m for m in picked if status.get(m) is None))
