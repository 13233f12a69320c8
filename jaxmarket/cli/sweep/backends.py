"""Running a sweep's cells: one at a time in this process (:func:`run_local`) or as Ray
tasks (:func:`run_ray`); each cell is one training run (:func:`run_cell`: a finished
cell is read back, an interrupted one resumed from its last checkpoint)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from jaxmarket.cli import Interrupted
from jaxmarket.cli.sweep.grid import Sweep, describe_values
from jaxmarket.cli.sweep.validation import Cell
from jaxmarket.compile_cache import compilation_cache
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import load_config
from jaxmarket.sessions import run as session_run
from jaxmarket.train.plan import RunPlan
from jaxmarket.train.publish import published, read_summary
from jaxmarket.train.run import resume_run, start_run


class SweepInterrupted(Interrupted):
    """Ctrl-C during a sweep (exit code 130 from the CLI): a local cell checkpoints its
    running chunk as the trainer does; Ray cells keep their last checkpoint. The message
    says how to resume the whole sweep."""

    def __init__(self, cell: int | None, run_dir: str):
        self.iteration, self.run_dir, self.cell = 0, run_dir, cell
        where = f" in cell {cell}" if cell is not None else ""
        Exception.__init__(self, f"sweep interrupted{where}; resume with "
                                 f"python -m jaxmarket.sweep --resume {run_dir}")


def run_cell(scenario: dict, overrides: list[str], cell_dir: str,
             compile_cache: str | None = None, plan: RunPlan | None = None) -> dict:
    """One cell: the summary.json of a finished cell; an interrupted one (a config.yaml
    and maybe checkpoints) continues from its last checkpoint with ``resume_run`` (the
    result is bit-identical to an uninterrupted run); a new one runs with ``start_run``,
    as ``python -m jaxmarket.train CONFIG --run-dir CELL_DIR OVERRIDES`` does
    (``scenario`` is CONFIG's content: ``load_config`` reads a mapping as it reads the
    file). ``plan``: the cell's resolved plan when the caller has it (a local sweep), so
    the cell is not resolved a second time."""
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
            return session_run.resume(path, config, session_plan, [])
        if path.exists():
            shutil.rmtree(path)
        return session_run.start(config, session_plan, path)
    with compilation_cache(compile_cache):
        if (path / "config.yaml").is_file():
            if load_config(path / "config.yaml") != load_config(scenario, overrides):
                raise ConfigError("--resume", str(path), "a cell whose config.yaml is the "
                                  "sweep's (it was changed; delete the cell to run it anew)")
            return resume_run(str(path))
        if path.exists():   # created but killed before its config.yaml was written: empty
            shutil.rmtree(path)
        if plan is not None:
            return start_run(plan, [], str(path))
        return start_run(scenario, overrides, str(path))


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
                run_cell(sweep.scenario, cell.overrides,
                         str(run_dir / "cells" / str(cell.index)), cache, cell.plan)
            except (Interrupted, KeyboardInterrupt):
                raise SweepInterrupted(cell.index, str(run_dir)) from None
            if not nested:
                bar.start()
            bar.update(task, advance=1)


def run_ray(sweep: Sweep, cells: list[Cell], run_dir: Path, todo: list[Cell],
             cache: str | None, address: str | None) -> None:
    ray = import_ray()
    started = not ray.is_initialized()
    if started and address:
        ray.init(address=address)
    elif started:   # a local Ray: quiet, no dashboard
        ray.init(log_to_driver=False, include_dashboard=False)
    try:
        task_fn = ray.remote(num_cpus=1)(run_cell)
        scenario = ray.put(sweep.scenario)
        pending = {task_fn.remote(scenario, c.overrides,
                                  str((run_dir / "cells" / str(c.index)).absolute()), cache): c
                   for c in todo}
        bar, task = _progress(len(cells), len(cells) - len(todo))
        with bar:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                cell = pending.pop(done[0])
                ray.get(done[0])   # a failed cell raises here (ray.exceptions.RayTaskError)
                print(f"sweep cell {cell.index} done: {describe_values(cell.values)}", flush=True)
                bar.update(task, advance=1, cell=f"cell {cell.index} done")
    except KeyboardInterrupt:
        raise SweepInterrupted(None, str(run_dir)) from None
    finally:
        if started:
            ray.shutdown()


def import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend", "ray", "an installed ray: pip install -e '.[ray]' "
                          "(or pip install 'ray[default]')") from None
    return ray


__all__ = ["SweepInterrupted", "import_ray", "run_cell", "run_local", "run_ray"]
