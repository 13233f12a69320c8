#!/bin/bash
# usage: tools/mutation/run.sh GROUP [mutmut run args]  (from the repo root)
# runs mutmut in the working copy .mutation/GROUP/ (tools/mutation/prep.py builds it)
set -e
g=$1; shift
cd "$(dirname "$0")/../../.mutation/$g"
export JAX_PLATFORMS=cpu JAX_COMPILATION_CACHE_DIR="$(cd ..; pwd)/jax-cache" \
  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 \
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
  TF_CPP_MIN_LOG_LEVEL=3
exec nice -n 15 ../../.venv/bin/mutmut run --max-children ${MAXC:-1} "$@"
