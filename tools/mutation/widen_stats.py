"""Associate every function with all tests of each test file it is already associated
with (mutmut records hits made in a module-scoped fixture only for the first test of
the module, so the other tests of that module would never run against the mutant)."""
import json
from collections import defaultdict

p = "mutants/mutmut-stats.json"
with open(p) as f:
    d = json.load(f)
by_file = defaultdict(set)
for t in d["duration_by_test"]:
    by_file[t.split("::")[0]].add(t)
added = 0
for fn, tests in d["tests_by_mangled_function_name"].items():
    wide = set(tests) | {t for f in {x.split("::")[0] for x in tests} for t in by_file[f]}
    added += len(wide) - len(tests)
    d["tests_by_mangled_function_name"][fn] = sorted(wide)
with open(p, "w") as f:
    json.dump(d, f, indent=2)
print("added", added, "test associations")
