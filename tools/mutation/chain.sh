#!/bin/bash
# stats + 1 mutant, widen the test map, then the seed-0 sample of N: tools/mutation/chain.sh GROUP N
g=$1; n=$2
tools="$(cd "$(dirname "$0")"; pwd)"
cd "$tools/../../.mutation/$g"
rm -f mutants/mutmut-stats.json
MAXC=1 "$tools/run.sh" $g $(../../.venv/bin/python "$tools/sample.py" $g 1)
../../.venv/bin/python "$tools/widen_stats.py"
MAXC=1 "$tools/run.sh" $g $(../../.venv/bin/python "$tools/sample.py" $g $n)
