"""Running a sweep's cells: one at a time in this process (:func:`run_local`) or as Ray
tasks on a cluster (:func:`run_ray`); each cell is one training run (:func:`run_cell`: a finished
cell is read back, an interrupted one resumed from its last checkpoint)."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import socket
import sys
from pathlib import Path

from jaxmarket.cli import Interrupted
from jaxmarket.cli.sweep.grid import Sweep, describe_values
from jaxmarket.cli.sweep.validation import Cell
from jaxmarket.cluster import ClusterError, connect
from jaxmarket.cluster.connect import connected, describe
from jaxmarket.compile_cache import compilation_cache
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.sessions import run as session_run
from jaxmarket.train.plan import RunPlan
from jaxmarket.train.publish import published, read_summary
from jaxmarket.train.run import resume_run, start_run

#: Ray runs a cell again (from its last checkpoint) after its worker or node died
MAX_RETRIES = 4


class SweepInterrupted(Interrupted):
    """Ctrl-C during a sweep (exit code 130 from the CLI): a local cell checkpoints its
    running chunk as the trainer does; Ray cells keep their last checkpoint. The message
    says how to resume the whole sweep."""

    def __init__(self, cell: int | None, run_dir: str):
        self.iteration, self.run_dir, self.cell = 0, run_dir, cell
        where = f" in cell {cell}" if cell is not None else ""
        Exception.__init__(self, f"sweep interrupted{where}; resume with "
                                 f"python -m jaxmarket.sweep --resume {run_dir}")


def cell_command(sweep: Sweep, overrides: list[str], cell_dir: str) -> str:
    """The ``python -m jaxmarket.train`` command a cell's run is (its run.json's
    ``command``, wherever the cell runs)."""
    return shlex.join(["python", "-m", "jaxmarket.train", str(sweep.config), "--run-dir",
                       str(cell_dir), *overrides])


def run_cell(scenario: dict, overrides: list[str], cell_dir: str,
             compile_cache: str | None = None, plan: RunPlan | None = None,
             command: str | None = None) -> dict:
    """One cell: the summary.json of a finished cell; an interrupted one (a config.yaml
    and maybe checkpoints) continues from its last checkpoint with ``resume_run`` (the
    result is bit-identical to an uninterrupted run); a new one runs with ``start_run``,
    as ``python -m jaxmarket.train CONFIG --run-dir CELL_DIR OVERRIDES`` does
    (``scenario`` is CONFIG's content: ``load_config`` reads a mapping as it reads the
    file). ``plan``: the cell's resolved plan when the caller has it (a local sweep), so
    the cell is not resolved a second time. ``command``: the run.json's command line
    (:func:`cell_command`)."""
    path = Path(cell_dir)
    if published(path):   # else resumed: a half-published result is published again
        return read_summary(path)
    config = load_config(scenario, overrides)
    engine, _, session_plan = session_run.choose_engine(config)
    if engine == "sessions":   # as python -m jaxmarket.train runs it: the session engine
        if (path / "config.yaml").is_file():
            if load_config(path / "config.yaml") != config:
                raise ConfigError("--resume", str(path), "a cell whose config.yaml is the "
                                  "sweep's (it was changed; delete the cell to run it anew)")
            return session_run.resume(path, config, session_plan, [], command=command)
        if path.exists():
            shutil.rmtree(path)
        return session_run.start(config, session_plan, path, command=command)
    with compilation_cache(compile_cache):
        if (path / "config.yaml").is_file():
            if load_config(path / "config.yaml") != load_config(scenario, overrides):
                raise ConfigError("--resume", str(path), "a cell whose config.yaml is the "
                                  "sweep's (it was changed; delete the cell to run it anew)")
            return resume_run(str(path), command=command)
        if path.exists():   # created but killed before its config.yaml was written: empty
            shutil.rmtree(path)
        if plan is not None:
            return start_run(plan, [], str(path), command=command)
        return start_run(scenario, overrides, str(path), command=command)


def _progress(total: int, done: int):
    # rich.progress: a third-party module only a running sweep needs
    from rich.progress import (BarColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                   TextColumn("{task.completed}/{task.total} cells"),
                   TextColumn("{task.fields[cell]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                   disable=not os.isatty(2) and os.environ.get("JAXMARKET_PROGRESS") != "1")
    task = bar.add_task("sweep", total=total, completed=done, cell="")
    return bar, task


def run_local(sweep: Sweep, cells: list[Cell], run_dir: Path, todo: list[Cell],
               cache: str | None) -> None:
    bar, task = _progress(len(cells), len(cells) - len(todo))
    # rich >= 14.1 nests the trainer's bar inside this one; older versions allow one live
    # display, so this one pauses while a cell runs
    nested = hasattr(bar.console, "_live_stack")
    with bar:
        for n, cell in enumerate(todo):
            bar.update(task, cell=f"cell {cell.index}: {describe_values(cell.values)}")
            print(f"sweep cell {cell.index} ({n + 1}/{len(todo)} to run): "
                  f"{describe_values(cell.values)}", flush=True)
            if not nested:
                bar.stop()
            try:
                cell_dir = str(run_dir / "cells" / str(cell.index))
                run_cell(sweep.scenario, cell.overrides, cell_dir, cache, cell.plan,
                         cell_command(sweep, cell.overrides, cell_dir))
            except (Interrupted, KeyboardInterrupt):
                raise SweepInterrupted(cell.index, str(run_dir)) from None
            if not nested:
                bar.start()
            bar.update(task, advance=1)


def ray_cell(scenario: dict, overrides: list[str], cell_dir: str,
             compile_cache: str | None, command: str) -> dict:
    """A cell as a Ray task holding one CPU (numba's session kernel on one thread): its
    summary and where it ran."""
    import numba
    import ray
    numba.set_num_threads(1)
    run_cell(scenario, overrides, cell_dir, compile_cache, command=command)
    return {"host": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id()}


def check_shared(ray, run_dir: Path, nodes: list[dict]) -> None:
    """A ClusterError unless every node with CPUs sees ``run_dir`` (a file written here
    is read there by a task pinned to the node): cells write their run directories
    where they run."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    probe = run_dir / f".shared-{secrets.token_hex(8)}"
    probe.write_text("jaxmarket")
    try:
        sees = ray.remote(num_cpus=0)(lambda p: os.path.isfile(p))
        refs = {sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["node_id"], soft=False)).remote(str(probe.absolute())): n
            for n in nodes if n["cpus"] > 0}
        blind = [refs[r] for r in refs if not ray.get(r)]
    finally:
        probe.unlink()
    if blind:
        names = ", ".join(f"{n['host']} ({n['address']})" for n in blind)
        raise ClusterError(f"ray cluster: the sweep directory {run_dir.absolute()} is not on "
                           f"storage every node sees ({names} cannot see it): give --run-dir "
                           "a path on shared storage (NFS, a cluster file system) mounted "
                           "at the same path on every node")


def run_ray(sweep: Sweep, cells: list[Cell], run_dir: Path, todo: list[Cell],
             cache: str | None, address: str | None, command: str | None = None) -> None:
    """The cells as Ray tasks (one CPU each) on the cluster at ``address`` (None: a Ray
    of this machine's own); a cell whose worker or node died is run again elsewhere,
    resuming from its last checkpoint. ``run_dir/run.json``: the command, the cluster
    and where each cell ran; Ray's output in ``run_dir/ray.log``."""
    with connected(address, run_dir) as ray:
        cluster = describe(ray, address)
        check_shared(ray, run_dir, cluster["nodes"])
        record = {"command": command if command is not None else shlex.join(sys.argv),
                  "cluster": cluster, "cells": {}}
        _write_record(run_dir, record)
        task_fn = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(ray_cell)
        scenario = ray.put(sweep.scenario)
        pending = {}
        for c in todo:
            cell_dir = str((run_dir / "cells" / str(c.index)).absolute())
            pending[task_fn.remote(scenario, c.overrides, cell_dir, cache,
                                   cell_command(sweep, c.overrides, cell_dir))] = c
        bar, task = _progress(len(cells), len(cells) - len(todo))
        try:
            with bar:
                while pending:
                    done, _ = ray.wait(list(pending), num_returns=1)
                    cell = pending.pop(done[0])
                    where = ray.get(done[0])   # a failed cell raises (RayTaskError)
                    record["cells"][str(cell.index)] = where
                    _write_record(run_dir, record)
                    print(f"sweep cell {cell.index} done on {where['host']} (node "
                          f"{where['node_id'][:8]}): {describe_values(cell.values)}; "
                          f"{len(cells) - len(pending)}/{len(cells)} cells", flush=True)
                    bar.update(task, advance=1, cell=f"cell {cell.index} done")
        except KeyboardInterrupt:
            raise SweepInterrupted(None, str(run_dir)) from None


def _write_record(run_dir: Path, record: dict) -> None:
    tmp = run_dir / "run.json.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(run_dir / "run.json")


def import_ray():
    return connect.import_ray("--backend")


__all__ = ["MAX_RETRIES", "SweepInterrupted", "cell_command", "check_shared", "import_ray",
           "ray_cell", "run_cell", "run_local", "run_ray"]
