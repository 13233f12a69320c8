"""What ``python -m jaxmarket.train`` runs once its arguments and config passed the
quick checks (:mod:`jaxmarket.cli.train` parses the command line): a new run, a
resumed one, or a session-engine run, and the end-of-run message."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax

from jaxmarket.cluster.blocks import OnCluster
from jaxmarket.compile_cache import compilation_cache, resolve
from jaxmarket.config.errors import ConfigError
from jaxmarket.config.loader import DEFAULT_CONFIG, load_config
from jaxmarket.sessions import run as session_run
from jaxmarket.train.distributed import initialize
from jaxmarket.train.run import finish_message, resume_run, start_run
from jaxmarket.train.rundir import read_run_config


def run(args, positional: str | None, overrides: list[str]) -> int:
    """Train as the parsed command line ``args`` says; the summary's final metrics and
    the end-of-run message on stdout (process 0 of a distributed run)."""
    address_flags = (args.coordinator_address, args.num_processes, args.process_id)
    if args.distributed:   # before anything compiles
        initialize(*address_flags)
    with compilation_cache(resolve(args.compile_cache)):
        summary = _run(args, positional, overrides)
    if jax.process_index() == 0:   # a distributed run: process 0 reports
        print(json.dumps(summary["final"], indent=2))
        print(session_run.finish_message(summary) if summary.get("engine") == "sessions"
              else finish_message(summary))
    return 0


def _run(args, positional: str | None, overrides: list[str]) -> dict:
    if args.resume:
        if args.config or positional:
            raise ConfigError("--resume", args.resume, "no scenario file with --resume: the run "
                              "directory's own config.yaml is used")
        allow = tuple(getattr(args, "allow_config_change", ()) or ())
        engine, plan, config = _resume_engine(args.resume, overrides, allow)
        if engine == "sessions":
            return session_run.resume(args.resume, config, plan, overrides,
                                      command=args.command, progress_every=args.progress_every,
                                      allow_changes=allow, cluster=ray_cluster(args))
        _no_ray(args)
        summary = resume_run(args.resume, args.tracker, args.mongo_url, overrides,
                             devices=args.devices, command=args.command,
                             progress_every=args.progress_every, allow_changes=allow)
    else:
        if args.config and positional:
            raise ConfigError("config", positional, f"one scenario file (--config {args.config} "
                              "was given too)")
        config = args.config or positional or str(DEFAULT_CONFIG)
        loaded = load_config(config, overrides)
        session_run.warm_kernel(loaded)
        engine, reason, plan = session_run.choose_engine(loaded)
        if engine == "sessions":
            _sessions_only(args)
            run_dir = args.run_dir or default_run_dir(config)
            return session_run.start(loaded, plan, run_dir, command=args.command,
                                     progress_every=args.progress_every,
                                     cluster=ray_cluster(args))
        _no_ray(args, reason)
        if reason is not None:
            print(f"engine: loop ({reason})")
        summary = start_run(config, overrides, args.run_dir, args.tracker, args.mongo_url,
                            devices=args.devices, command=args.command,
                            progress_every=args.progress_every)
    return summary


def default_run_dir(config: str) -> str:
    return f"runs/{Path(config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def _sessions_only(args) -> None:
    """Flags of the loop that a sessions run does not take: a one-line error."""
    if args.tracker != "files" or args.devices is not None or args.distributed:
        raise ConfigError("train.engine", "sessions", "--tracker files, no --devices and no "
                          "--distributed (the session engine writes its run directory; set "
                          "train.engine=loop for the loop's trackers and sharding)")


def ray_cluster(args):
    """``--ray [ADDRESS]``: where a sessions run's blocks play (None: here)."""
    if getattr(args, "ray", None) is None:
        return None
    return OnCluster(None if args.ray == "local" else args.ray)


def _no_ray(args, reason: str | None = None) -> None:
    """``--ray`` on a loop run: a one-line error (the loop spreads over hosts with
    jax.distributed)."""
    if getattr(args, "ray", None) is not None:
        raise ConfigError("--ray", args.ray, "a session-engine design (this run is on the "
                          "loop engine" + (f": {reason}" if reason else "") + "; the loop "
                          "runs across hosts with --distributed, docs/cluster.md)")


def _resume_engine(run_dir: str, overrides: list[str], allow: tuple[str, ...] = ()):
    """``(engine, plan, config)`` of the run in ``run_dir``: a sessions run directory
    holds sessions.csv or a config whose engine resolves to sessions."""
    path = Path(run_dir)
    if not (path / "config.yaml").is_file():
        return "loop", None, None   # resume_run names the problem
    engine, _, plan = session_run.choose_engine(read_run_config(path))
    if engine != "sessions":
        return engine, None, None
    session_run.check_resume_overrides(overrides, allow)
    return engine, plan, load_config(path / "config.yaml", overrides)
