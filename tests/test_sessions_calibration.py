"""The kernel's rounding kept beside JAX's compilation cache
(jaxmarket.sessions.calibration): a kept answer is the calibration's, it is read back
instead of calibrating again, and any change to the question asks afresh."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from jaxmarket.config.loader import load_config
from jaxmarket.sessions import calibration
from jaxmarket.sessions import engine as eng
from jaxmarket.sessions.game import make_game
from jaxmarket.sessions.run import session_plan


@pytest.fixture(scope="module")
def game():
    return make_game(session_plan(load_config("configs/calvano.yaml", [
        "learners.sellers.grid_size=5", "train.num_seeds=64"])))


@pytest.fixture
def cache(tmp_path):
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    yield tmp_path / calibration.FOLDER
    jax.config.update("jax_compilation_cache_dir", before)


def _settings(sessions: int = 64) -> eng.Settings:
    return eng.Settings(sessions=sessions, periods=2000, chunk=1000, backend="kernel")


def test_a_kept_rounding_is_the_calibrations_and_is_read_back(game, cache, monkeypatch):
    fresh = eng.Runner(game, _settings())._calibrate(64)      # asked of XLA's program
    runner = eng.Runner(game, _settings())                     # calibrates, keeps it
    kept = list(cache.glob("*.json"))
    assert len(kept) == 1 and runner.rounding(64) == fresh
    assert json.loads(kept[0].read_text())["rounding"] == list(fresh)

    def fail(self, size):
        raise AssertionError("calibrated again")
    monkeypatch.setattr(eng.Runner, "_calibrate", fail)
    assert eng.Runner(game, _settings()).rounding(64) == fresh   # read back
    with pytest.raises(AssertionError, match="calibrated again"):
        eng.Runner(game, _settings(128))                       # another batch size: asked


def test_without_a_cache_every_run_calibrates(game, monkeypatch):
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    calls = []
    monkeypatch.setattr(eng.Runner, "_calibrate",
                        lambda self, size: calls.append(size) or (True, True))
    try:
        eng.Runner(game, _settings())
        eng.Runner(game, _settings())
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    assert calls == [64, 64]


def test_the_fingerprint_changes_with_every_part_of_the_question(game):
    base = calibration.fingerprint(game, 64, 0)
    assert calibration.fingerprint(game, 64, 0) == base        # a function of the question
    reward = np.asarray(game.reward).copy()
    reward[3, 1] = np.nextafter(reward[3, 1], np.float32(np.inf))   # one ulp of one entry
    changed = dataclasses.replace(game, reward=jax.numpy.asarray(reward))
    settings = dataclasses.replace(game.settings,
                                   learning_rate=game.settings.learning_rate * 0.5)
    others = {calibration.fingerprint(game, 128, 0), calibration.fingerprint(game, 64, 1000),
              calibration.fingerprint(changed, 64, 0),
              calibration.fingerprint(dataclasses.replace(game, settings=settings), 64, 0)}
    assert base not in others and len(others) == 4


def test_an_unreadable_kept_answer_is_calibrated_and_written_again(game, cache):
    cache.mkdir(parents=True)
    path = cache / f"{calibration.fingerprint(game, 64, 1000)}.json"
    path.write_text("{not json")
    assert calibration.kept_rounding(game, 64, 1000, lambda: (False, True)) == (False, True)
    assert json.loads(path.read_text())["rounding"] == [False, True]
    assert calibration.kept_rounding(game, 64, 1000, lambda: (True, True)) == (False, True)


def test_a_kept_answer_of_three_roundings_reads_back_whole(game, cache):
    # the general kernel's answer has three flags (target, increment, pending sum)
    assert calibration.kept_rounding(game, 64, 7, lambda: (True, False, True)) == \
        (True, False, True)
    assert calibration.kept_rounding(game, 64, 7, lambda: (False, False)) == \
        (True, False, True)


@pytest.mark.parametrize("path, overrides, starts", [
    ("configs/calvano.yaml", [], True),
    ("configs/klein2021.yaml", [], True),                          # may be the kernel's
    ("configs/calvano.yaml", ["train.session_backend=xla"], False),
    ("configs/calvano.yaml", ["train.engine=loop"], False),
    ("configs/calvano_ppo.yaml", [], False),                        # PPO sellers
], ids=["calvano", "klein", "xla", "loop", "ppo"])
def test_a_training_command_starts_the_kernels_compilation_only_where_it_may_run(
        path, overrides, starts, monkeypatch):
    # Bugs caught: the start-up overlap (numba compiling the kernel while the run builds
    # its plan and tables) not started for a design the kernel plays, or started where
    # the run cannot take the kernel (xla chosen, the general loop, PPO sellers).
    from jaxmarket.sessions import kernel
    from jaxmarket.sessions.run import warm_kernel
    calls = []
    monkeypatch.setattr(kernel, "precompile", lambda after=None: calls.append(True))
    warm_kernel(load_config(path, overrides))
    assert bool(calls) is starts


def test_the_precompiled_loop_is_the_one_the_run_calls(monkeypatch):
    # Bug caught: precompile() compiling a signature the run's calls do not have (a
    # second compilation at the first chunk, the overlap lost): the types of a real
    # game's chunk call are the precompiled signature.
    import numba
    from jaxmarket.sessions import kernel
    game = make_game(session_plan(load_config("configs/calvano.yaml", [
        "learners.sellers.grid_size=3", "train.num_seeds=2"])))
    calls = []
    loop = kernel._run_sessions
    monkeypatch.setattr(kernel, "_run_sessions", lambda *a: calls.append(a) or loop(*a))
    chunk = kernel.make_kernel_chunk(game, 10, 5)
    chunk(eng.init_sessions(game, 2, jax.random.key(0)), 0)
    # the first call's probe, then the chunk's: one call per slice of the sessions
    assert len(calls) == 1 + min(2, kernel.numba_threads())
    for args in calls:
        assert tuple(numba.typeof(a) for a in args) == kernel.plain_signature()


@pytest.mark.parametrize("value, possible", [("cuda", True), ("tpu", True), ("cpu", False),
                                             ("CPU", False), ("cuda,cpu", True)])
def test_the_fork_is_refused_where_jax_may_take_an_accelerator(value, possible, monkeypatch):
    # Bug caught: a child compiling the CPU kernel beside a run that JAX puts on a GPU
    # (JAX_PLATFORMS naming one), or the fork refused on a CPU-only machine
    from jaxmarket.sessions import warmup
    monkeypatch.delenv("JAX_PLATFORM_NAME", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", value)
    assert warmup._accelerator_possible() is possible


def test_no_fork_from_a_process_that_imported_jax(monkeypatch):
    # Bug caught: forking a process whose JAX may hold threads and locks (a test, a
    # notebook): the child could deadlock; the thread compiles there instead
    from jaxmarket.sessions import warmup
    forks = []
    monkeypatch.setattr(warmup.os, "fork", lambda: forks.append(1) or 0)
    assert warmup.fork_compile(load_config("configs/calvano.yaml", [])) is False
    assert forks == [] and warmup._CHILDREN == []


@pytest.mark.slow
def test_the_run_loads_the_loop_its_forked_children_compiled(tmp_path):
    # Bugs caught: python -m jaxmarket.train compiling the kernel on its own thread
    # although it forked children to do so (the fork's gain lost, twice the work), the
    # children's compilation not landing in numba's cache, or a second run forking
    # again (CPU spent loading what its own thread loads). With numba's cache empty, a
    # cache hit in the run's own process can only be the children's compilation.
    import os
    import subprocess
    import sys
    script = (
        "import json, os, sys\n"
        "forks = []\n"
        "fork = os.fork\n"
        "os.fork = lambda: forks.append(1) or fork()\n"
        "from jaxmarket.cli.train import main\n"
        "main(sys.argv[1:])\n"
        "from jaxmarket.sessions import kernel\n"
        "sig = kernel.plain_signature()\n"
        "st = kernel._run_sessions.stats\n"
        "print('STATS', json.dumps([len(forks), st.cache_hits[sig], st.cache_misses[sig]]))\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               JAXMARKET_COMPILE_CACHE=str(tmp_path / "xla"), JAX_PLATFORMS="cpu")
    seen = []
    for run in ("first", "second"):
        done = subprocess.run(
            [sys.executable, "-c", script, "configs/calvano.yaml", "--run-dir",
             str(tmp_path / run), "train.num_seeds=2", "train.num_iterations=500",
             "learners.sellers.grid_size=3"],
            env=env, capture_output=True, text=True, timeout=600, check=True)
        stats = [line for line in done.stdout.splitlines() if line.startswith("STATS")]
        seen.append(json.loads(stats[-1].split(" ", 1)[1]))
    # forks, then the loop loaded from numba's cache, never compiled in the run
    assert seen == [[2, 1, 0], [0, 1, 0]]
    assert list((tmp_path / "numba").rglob("kernel._run_sessions-*.nbi"))


@pytest.mark.slow
def test_the_callees_precompiled_apart_are_the_ones_the_loop_calls(tmp_path):
    # Bug caught: kernel.callee_signatures() out of step with the loop's calls (an edit
    # to a call's argument types): the half compiled apart is then not the one the loop
    # links, and the loop's process compiles it again (the split's gain lost)
    import os
    import subprocess
    import sys
    script = (
        "import json\n"
        "from jaxmarket.sessions import kernel\n"
        "kernel._run_sessions.compile(kernel.plain_signature())\n"
        "print(json.dumps([[str(s) for s in f.signatures] == [str(sig)]\n"
        "                  for f, sig in kernel.callee_signatures().items()]))\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, True]
