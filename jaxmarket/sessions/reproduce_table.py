"""The results table of docs/reproductions.md, from reproduction.json files.

    python -m jaxmarket.sessions.reproduce_table RESULTS... [--write PAGE]

Each RESULTS is a ``reproduction.json`` file, a run directory holding one, or a folder
of ``NAME.json`` copies (``benchmarks/results/reproductions/``). The table has one row
per shipped design (by name), then one per result of another design; a design without a
result is listed as ``not run``, a run smaller than its design (fewer sessions or a
lower period cap) says so. Under the table, each design's ``root_cause``. Printed, or
with ``--write`` put between the markers ``<!-- reproductions:begin -->`` and
``<!-- reproductions:end -->`` of the markdown file PAGE (docs/reproductions.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from jaxmarket.config.errors import ConfigError
from jaxmarket.sessions.reproduce import RESULT_FILE, list_designs, published_text

BEGIN, END = "<!-- reproductions:begin -->", "<!-- reproductions:end -->"
HEADER = ("| design | source | figure | published | ours (95% CI) | verdict | sessions × "
          "periods | wall |\n|---|---|---|---|---|---|---|---|")


def load_results(paths: Iterable[str | Path]) -> dict[str, dict]:
    """``{name: reproduction.json}`` of every result under ``paths`` (module docstring);
    a later path's result of a name replaces an earlier one."""
    out: dict[str, dict] = {}
    for path in map(Path, paths):
        if path.is_dir():
            files = [path / RESULT_FILE] if (path / RESULT_FILE).is_file() else \
                sorted(path.glob("*.json"))
        elif path.is_file():
            files = [path]
        else:
            raise ConfigError("results", str(path), "a reproduction.json file, a run "
                              "directory or a folder of NAME.json results")
        for f in files:
            try:
                result = json.loads(f.read_text())
                out[str(result["name"])] = result
            except (ValueError, KeyError, TypeError):
                raise ConfigError("results", str(f), "a reproduction.json (JSON with a "
                                  "name)") from None
    return out


def _periods(n: int) -> str:
    return f"{n:,d}"


def _size(result: dict) -> str:
    text = f"{result['sessions']:,d} × {_periods(result['periods'])}"
    if result["periods"] < result["max_periods"]:
        text += f" (cap {_periods(result['max_periods'])})"
    reduced = []
    if result["sessions"] < result["design_sessions"]:
        reduced.append(f"{result['design_sessions']:,d} sessions")
    if result["max_periods"] < result["design_max_periods"]:
        reduced.append(f"{_periods(result['design_max_periods'])} periods")
    if reduced:
        text += "; **reduced**, the design: " + ", ".join(reduced)
    return text


def _row(name: str, design, result: dict | None) -> str:
    figure = design.figure if design is not None else result["figure"]
    source = design.source if design is not None else result["source"]
    published = design.published if design is not None else result["published"]
    cells = [f"`{name}`", source, figure, published_text(published)]
    if result is None:
        cells += ["not run", "", "", ""]
    else:
        lo, hi = result["ci95"]
        cells += [f"**{result['value']:.4f}** [{lo:.4f}, {hi:.4f}]", result["verdict"],
                  _size(result), f"{result['wall_s']:.0f} s"]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def reproductions_table(paths: Iterable[str | Path]) -> str:
    """The markdown table (module docstring) of the results under ``paths``."""
    results = load_results(paths)
    designs = {d.name: d for d in list_designs()}
    names = list(designs) + sorted(set(results) - set(designs))
    lines = [HEADER] + [_row(n, designs.get(n), results.get(n)) for n in names]
    causes = [(n, results[n].get("root_cause") or (designs[n].root_cause if n in designs
                                                   else None))
              for n in names if n in results]
    notes = [f"- `{n}`: {cause}" for n, cause in causes if cause]
    return "\n".join(lines + ([""] + notes if notes else []))


def replace_between_markers(text: str, table: str, where: str = "the file") -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ConfigError(where, "its markers", f"one {BEGIN} line before one {END} line")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def between_markers(text: str) -> str:
    """What sits between the markers (without the newlines next to them)."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxmarket.sessions.reproduce_table",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="reproduction.json files or folders")
    parser.add_argument("--write", default=None, metavar="PAGE",
                        help="replace the table between the markers of the markdown file PAGE")
    args = parser.parse_args(argv)
    try:
        table = reproductions_table(args.results)
        if args.write is None:
            print(table)
        else:
            path = Path(args.write)
            path.write_text(replace_between_markers(path.read_text(), table, str(path)))
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
