"""Results files of the benchmarks: ``benchmarks/results/NAME.json``.

Every benchmark script takes ``--write [NAME]`` (write ``benchmarks/results/NAME.json``;
without NAME the script's own name for the mode it ran) and ``--json-out PATH`` (write
that file). Both write the JSON the script prints with ``--json`` under ``results``,
beside what docs/benchmarks.md states about it::

    {"benchmark": "throughput.py", "command": "python benchmarks/throughput.py ...",
     "date": "2026-12-04T21:40:00+00:00", "machine": {"cpu": ..., "nproc": ...,
     "load_avg": [...], "jax": ..., "backend": ...}, "results": {...}}

``command`` is the command line that ran, without ``--write`` and ``--json-out``.
``python benchmarks/render_docs.py`` renders docs/benchmarks.md's tables from these files.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]


def relative_paths(value):
    """``value`` with every string path inside the repository made relative to its root
    (a results file names no directory of the machine that wrote it)."""
    if isinstance(value, dict):
        return {k: relative_paths(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [relative_paths(v) for v in value]
    if isinstance(value, str) and value.startswith(f"{ROOT}{os.sep}"):
        return os.path.relpath(value, ROOT)
    return value


def machine_info() -> dict:
    """CPU model (``/proc/cpuinfo``), cores, load average, JAX version and backend."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    info = {"cpu": model, "nproc": os.cpu_count(), "load_avg": [round(x, 2) for x in load]}
    try:
        import jax
        info.update(jax=jax.__version__, backend=jax.default_backend())
    except ImportError:
        pass
    return info


def initial_environment() -> dict:
    """The environment the process started with (a script may set ``XLA_FLAGS`` itself
    before importing JAX; the command line is what the user typed)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return dict(os.environ)
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def add_arguments(parser, default_name: str) -> None:
    """``--write [NAME]`` and ``--json-out PATH`` (module docstring); ``default_name``
    names the default NAME in the help (a mode may choose its own at ``write``)."""
    parser.add_argument("--write", nargs="?", const="", default=None, metavar="NAME",
                        help="write benchmarks/results/NAME.json, last on the command line "
                             f"(default NAME: {default_name})")
    parser.add_argument("--json-out", default=None, metavar="PATH",
                        help="write the results file (benchmark, command, date, machine, "
                             "results) to PATH")


def command(script: str, argv: list[str] | None) -> str:
    """The command line of ``script`` with ``argv``, less ``--write``/``--json-out``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    kept, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--json-out":
            skip = True
            continue
        if arg == "--write":
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("-")   # its NAME
            continue
        if arg.startswith(("--write=", "--json-out=")):
            continue
        kept.append(arg)
    env = initial_environment().get("XLA_FLAGS")
    prefix = f"XLA_FLAGS={shlex.quote(env)} " if env and "host_platform_device_count" in env \
        else ""
    return f"{prefix}python benchmarks/{Path(script).name} {shlex.join(kept)}".rstrip()


def dumps(value, indent: str = "") -> str:
    """JSON with one key per line and lists of numbers, strings or booleans on one line."""
    inner = indent + " "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(str(k))}: {dumps(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple))
                                                for v in value):
        return "[\n" + ",\n".join(inner + dumps(v, inner) for v in value) + f"\n{indent}]"
    return json.dumps(value)


def write(args, results, script: str, argv: list[str] | None, name: str,
          machine: dict | None = None) -> list[Path]:
    """Write the results file(s) asked for by ``args.write`` / ``args.json_out``;
    ``name``: the file's NAME where ``--write`` names none."""
    paths = []
    if getattr(args, "write", None) is not None:
        if "=" in args.write or "/" in args.write:
            raise SystemExit(f"--write {args.write}: a results name (put --write last, "
                             "after any overrides)")
        paths.append(RESULTS_DIR / f"{args.write or name}.json")
    if getattr(args, "json_out", None):
        paths.append(Path(args.json_out))
    if not paths:
        return []
    if isinstance(results, dict) and machine is None and isinstance(results.get("machine"),
                                                                     dict):
        machine = results["machine"]
    record = {"benchmark": Path(script).name, "command": command(script, argv),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                  timespec="seconds"),
              "machine": machine or machine_info(), "results": relative_paths(results)}
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(record) + "\n")
        print(f"results written to {path}", file=sys.stderr)
    return paths
