"""docs/benchmarks.md's figures, rendered from the results files the benchmarks write.

    python benchmarks/render_docs.py            # rewrite the page's results blocks
    python benchmarks/render_docs.py --check    # exit 1 where the page or a file drifted

Every measured figure of docs/benchmarks.md sits between two markers,
``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``, and is rendered by
:data:`BLOCKS` ``[NAME]`` from ``benchmarks/results/*.json`` (each written by a benchmark's
``--write``, benchmarks/record.py: ``{"benchmark", "command", "date", "machine",
"results"}``). Each block ends with where its figures come from: the command, the date,
the machine and the results file. ``--check`` renders every block and reports each block
whose text on the page differs, each results file missing a key a block needs, and each
block without a renderer; it changes nothing. After a benchmark's ``--write``, run this
script to put its figures on the page.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "benchmarks" / "results"
REQUIRED = ("benchmark", "command", "date", "machine", "results")
TRANSCRIBED = "transcribed from the page's last measurement"
BLOCK = re.compile(r"<!-- results:([\w-]+) -->\n(.*?)<!-- /results:\1 -->", re.S)


class MissingResult(Exception):
    """A results file, or a key a block needs, is missing."""


class Result:
    """One results file: ``r["results.a.b"]`` (or ``r["results"]["a.b"]``) reads a dotted
    path, naming the file and the key in :class:`MissingResult` where it is absent."""

    def __init__(self, name: str, data: dict, prefix: str = ""):
        self.name, self.data, self.prefix = name, data, prefix

    def __getitem__(self, path: str):
        value, path = self.data, self.prefix + path
        if path == "results" and isinstance(self.data.get("results"), dict):
            return Result(self.name, self.data, "results.")   # x["a.b"] reads results.a.b
        for part in path.split("."):
            if isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            elif isinstance(value, dict) and part in value:
                value = value[part]
            else:
                raise MissingResult(f"benchmarks/results/{self.name}.json has no key {path!r}")
        return value

    def get(self, path: str, default=None):
        try:
            return self[path]
        except MissingResult:
            return default


def load(results_dir: Path, name: str) -> Result:
    path = Path(results_dir) / f"{name}.json"
    if not path.is_file():
        raise MissingResult(f"benchmarks/results/{name}.json is missing")
    data = json.loads(path.read_text())
    result = Result(name, data)
    for key in REQUIRED:
        result[key]
    return result


# -- formatting -----------------------------------------------------------------------

def n(x, digits: int = 0) -> str:
    """``x`` with thousands separators and ``digits`` decimals."""
    return f"{x:,.{digits}f}"


def g(x, digits: int = 3) -> str:
    return f"{x:.{digits}g}"


def table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A markdown table; ``align`` one letter per column (``l``, ``r``)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [header, rule] + rows
    return "\n".join("| " + " | ".join(str(c) for c in line) + " |" for line in lines)


def machine(m: dict) -> str:
    load = m.get("load")
    if load is None and m.get("load_avg") is not None:
        load = " / ".join(f"{x:.2f}" for x in m["load_avg"])
    parts = [f"{m.get('nproc', '?')} cores", f"\"{m.get('cpu', 'unrecorded')}\""]
    if load is not None:
        parts.append(f"load {load}")
    if m.get("jax"):
        parts.append(f"JAX {m['jax']}" + (f" ({m['backend']})" if m.get("backend") else ""))
    return ", ".join(parts)


def source(*results: Result) -> str:
    """The provenance lines of a block: command, date, machine, file."""
    lines = []
    for r in results:
        date = str(r["date"]).replace("T", " ").replace("+00:00", " UTC")
        line = (f"`{r['command']}`: {date}, {machine(r['machine'])}; "
                f"`benchmarks/results/{r.name}.json`")
        if r.get("source"):
            line += f" ({r['source']})"
        lines.append("- " + line)
    return "Source:\n\n" + "\n".join(lines)


# -- the blocks -----------------------------------------------------------------------

Loader = Callable[[str], Result]


def throughput(get: Loader) -> str:
    r = get("throughput")
    x = r["results"]
    return table(
        ["markets x steps", "env steps/s (median)", "best call", "agent steps/s",
         "us / env step", "compile s", "first call s", "cores used", "peak RSS MB"],
        [[f"{x['num_envs']:,} x {x['steps']}", f"**{n(x['env_steps_per_s'])}**",
          n(x["env_steps_per_s_best"]), n(x["agent_steps_per_s"]), n(x["us_per_env_step"], 2),
          n(x["compile_s"], 1), n(x["first_call_s"], 1), n(x["cores_used"], 2),
          n(x["peak_rss_mb"])]]) + "\n\n" + source(r)


def throughput_against_minimal(get: Loader) -> str:
    r = get("throughput_against_minimal")
    x = r["results"]
    before, after = x["minimal_runs"]
    return table(
        ["simulator env steps/s (median)", "minimal step (before, after)", "ratio",
         "peak RSS MB", "target (ratio >= 1, < 2 GiB)"],
        [[n(x["env_steps_per_s"]), f"{n(before)}, {n(after)}",
          f"**{x['ratio_vs_minimal']:.3f}**", n(x["peak_rss_mb"]),
          "**met**" if x["target_met"] else "not met"]]) + "\n\n" + source(r)


def throughput_breakdown(get: Loader) -> str:
    r = get("throughput_breakdown")
    x = r["results"]
    rows = [[f"`{row['part']}`" if " " not in row["part"] else row["part"],
             n(row["us_per_env_step"], 2)] for row in x["breakdown"]]
    rows.append(["the whole step (`env.step`, auto-reset included), this run",
                 n(x["us_per_env_step"], 2)])
    return table(["part (with the random actions)", "us / env step"], rows) + "\n\n" \
        + source(r)


def throughput_sweep(get: Loader) -> str:
    r = get("throughput_sweep")
    rows = [[row["kind"], row["consumers"], row["sellers"], row["products"], row["num_envs"],
             n(row["us_per_env_step"], 2), n(row["ns_per_entity_product"], 2),
             n(row["ns_per_consumer_seller_product"], 4), n(row["compile_s"], 1)]
            for row in r["results"]]
    return table(["kind", "C", "S", "P", "num_envs", "us / market step", "ns / ((C+S)P)",
                  "ns / (C S P)", "compile s"], rows, "lrrrrrrrr") + "\n\n" + source(r)


def train_throughput(get: Loader) -> str:
    r = get("train_throughput")
    x = r["results"]
    ratios = ", ".join(f"{v:.3f}" for v in x["ratios_vs_env_only"])
    return table(
        ["env steps/s (with learning)", "best call", "agent steps/s", "us / iteration",
         "compile s", "cores used", "env-only env steps/s", "training / env-only",
         "target >= 0.6"],
        [[f"**{n(x['env_steps_per_s'])}**", n(x["env_steps_per_s_best"]),
          n(x["agent_steps_per_s"]), n(x["us_per_iteration"]), n(x["compile_s"], 1),
          n(x["cores_used"], 2), n(x["env_only_env_steps_per_s"]),
          f"**{x['ratio_vs_env_only']:.3f}** (rounds {ratios})",
          "**met**" if x["target_met"] else "not met"]]) + "\n\n" + source(r)


def train_throughput_profile(get: Loader) -> str:
    r = get("train_throughput")
    rows = [[row["variant"], n(row["us_per_iteration"]), n(row["env_steps_per_s"])]
            for row in r["results.profile"]]
    return table(["variant", "us / iteration", "env steps/s"], rows) + "\n\n" + source(r)


def bandit_update(get: Loader) -> str:
    a, b = get("bandit_update"), get("bandit_update_slots")
    rows = [[label, f"**{n(x['results.update_ms'], 1)}**", n(x["results.update_ms_best"], 1),
             n(x["results.update_cpu_ms"], 1), n(x["results.compile_s"], 1)]
            for label, x in (("policy-major feature buffer (bench_b's layout)", a),
                             ("per-slot buffer (`--layout slots`)", b))]
    rows.append(["per-slot / feature buffer",
                 f"{b['results.update_ms'] / a['results.update_ms']:.1f}x", "", "", ""])
    return table(["buffer", "update, wall ms (median)", "best", "CPU ms", "compile s"], rows) \
        + "\n\n" + source(a, b)


def ppo_cartpole(get: Loader) -> str:
    one, eight = get("ppo_cartpole"), get("ppo_cartpole_seeds8")
    rows = []
    for x in (one, eight):
        per_seed = x["results.final_return_per_seed"]
        rows.append([x["results.seeds"], f"**{n(x['results.env_steps_per_s'])}**",
                     f"**{x['results.final_return']:.1f}**"
                     + (f" (seeds {min(per_seed):.1f}-{max(per_seed):.1f})"
                        if len(per_seed) > 1 else ""),
                     n(x["results.compile_s"], 1)])
    return table(["seeds", "env steps/s (all seeds, excl. compile)", "final return",
                  "compile s"], rows) + "\n\n" + source(one, eight)


def ppo_market(get: Loader) -> str:
    r = get("ppo_market")
    x = r["results"]
    rounds = lambda v: ", ".join(f"{t:.3f}" for t in v)   # noqa: E731
    iters = x["iterations_per_call"]
    rows = [["market, `ppo` defaults (`group_by_policy: auto`: grouped)",
             f"**{n(x['agent_steps_per_s'])}**", n(x["market.agent_steps_per_s_best"]),
             n(x["ms_per_iteration"], 2), n(x["market.compile_s"], 1),
             f"**{x['ratio']:.3f}** ({rounds(x['ratios'])})"],
            ["market, `group_by_policy: false` (per-slot)",
             n(x["per_slot_agent_steps_per_s"]), n(x["per_slot.agent_steps_per_s_best"]),
             n(1e3 * x["per_slot.run_s"] / iters, 2), n(x["per_slot.compile_s"], 1),
             f"{x['per_slot_ratio']:.3f} ({rounds(x['per_slot_ratios'])})"],
            [f"CartPole ({x['cartpole_layout.seeds']} seeds x {x['cartpole_layout.envs']} "
             "envs)", n(x["cartpole_agent_steps_per_s"]), n(x["cartpole.agent_steps_per_s_best"]),
             n(x["cartpole_ms_per_iteration"], 2), n(x["cartpole.compile_s"], 1), ""]]
    return table(["side", "agent steps/s (median)", "best call", "ms / iteration", "compile s",
                  "ratio to CartPole (median; rounds)"], rows) \
        + f"\n\nTarget ratio >= {x['target_ratio']}: **{'met' if x['target_met'] else 'not met'}**." \
        + "\n\n" + source(r)


def ppo_market_profile(get: Loader) -> str:
    r = get("ppo_market_profile")
    rows = r["results.profile"]
    full = rows[0]["ms_per_iteration"]
    out = [[row["variant"], n(row["ms_per_iteration"], 2),
            f"{100 * row['ms_per_iteration'] / full:.0f}%"] for row in rows]
    return table(["variant", "ms / iteration", "of the full market iteration"], out) \
        + "\n\n" + source(r)


def calvano(get: Loader) -> str:
    r, small = get("calvano"), get("calvano_64")
    x = r["results"]
    mean = x["mean_convergence_period"]
    rows = [[f"{len(x['converged']):,} (the published experiment)", f"**{n(x['wall_s'], 1)}**",
             n(x["compile_s"], 1), f"**{x['profit_gain']:.4f}** (sd {x['profit_gain_sd']:.3f})",
             f"{sum(map(bool, x['converged'])):,} / {len(x['converged']):,}",
             f"{n(mean)} (slowest {n(x['max_convergence_period'])})",
             n(x["ns_per_session_period"], 1), x["backend"]]]
    y = small["results"]
    rows.append([f"{len(y['converged']):,} (beta 2e-4, window 10,000)", n(y["wall_s"], 1),
                 n(y["compile_s"], 1), f"{y['profit_gain']:.4f} (sd {y['profit_gain_sd']:.3f})",
                 f"{sum(map(bool, y['converged'])):,} / {len(y['converged']):,}",
                 n(y["mean_convergence_period"]), n(y["ns_per_session_period"], 1),
                 y["backend"]])
    return table(["sessions", "wall s", "compile s", "profit gain Delta", "converged",
                  "mean convergence period", "ns / session-period", "backend"], rows) \
        + f"\n\nTarget (1000 sessions in at most 60 s): " \
        f"**{'met' if x['target_met'] else 'not met'}**.\n\n" + source(r, small)


#: kernel over XLA session-periods per second that every design should reach
TARGET_SESSIONS = 3.0


def sessions_throughput(get: Loader) -> str:
    r = get("sessions_throughput")
    ratio = {row["design"]: row for row in r.get("results.ratios") or []}
    rows = []
    for row in r["results.designs"]:
        kept = ratio.get(row["design"]) if row["backend"] == "kernel-cpu" else None
        rows.append([row["design"], row["backend"], f"{row['sessions']:,} x {row['periods']:,}",
                     f"**{n(row['session_periods_per_s'])}**",
                     n(row.get("session_periods_per_cpu_s")), n(row["wall_s"], 1),
                     n(row.get("cpu_s"), 1), n(row["compile_s"], 1),
                     "" if kept is None else f"**{kept['kernel_over_xla']:.2f}x**"])
    rows += [[row["design"], row["backend"], "skipped", row["reason"], "", "", "", "", ""]
             for row in r["results.skipped"] if row["backend"] != "xla-gpu"]
    met = [row for row in ratio.values() if row["target_met"]]
    target = "" if not ratio else \
        f"\n\nTarget (kernel at least {TARGET_SESSIONS:.0f}x XLA for every design): " \
        f"**{'met' if len(met) == len(ratio) else 'not met'}** ({len(met)} of " \
        f"{len(ratio)} designs)."
    return table(["design", "backend", "sessions x periods", "session-periods / s",
                  "per CPU-s", "wall s", "CPU s", "compile s", "kernel / xla"], rows,
                 "llllrrrrr") + target + "\n\n" + source(r)


def calvano_cpu(get: Loader) -> str:
    r = get("calvano_cpu")
    rows = []
    y = r.get("results.yardstick")
    if y is not None:
        rows.append(["plain C loop (`--yardstick`)", f"{y['sessions']:,}", n(y["wall_s"], 1),
                     f"**{n(y['cpu_s'], 1)}**", n(y["session_periods"]),
                     f"**{n(y['session_periods_per_cpu_s'])}**", f"{y['profit_gain']:.4f}"])
    p = r["results.product"]
    rows.append([f"`{p['command']}`", f"{p['sessions']:,}", n(p["wall_s"], 1),
                 f"**{n(p['cpu_s'], 1)}**", n(p["session_periods"]),
                 f"**{n(p['session_periods_per_cpu_s'])}**", f"{p['profit_gain']:.4f}"])
    text = table(["command", "sessions", "wall s", "CPU s", "session-periods learnt",
                  "per CPU-s", "profit gain Delta"], rows, "lrrrrrr")
    q = r.get("results.ratio")
    if q is not None:
        text += f"\n\nPer CPU-second, start-up included: **{q['product_over_yardstick']:.2f}x** " \
                f"the C loop (target {q['target']:.1f}x: " \
                f"**{'met' if q['target_met'] else 'not met'}**)."
    c = r.get("results.start")
    if c is not None:
        pairs = c.get("pairs") or [c]
        text += "\n\n" + table(
            ["pair", "first run (empty caches) wall s", "CPU s", "second run wall s", "CPU s",
             "first over second"],
            [[str(k + 1), n(p["cold"]["wall_s"], 1), n(p["cold"]["cpu_s"], 1),
              n(p["warm"]["wall_s"], 1), n(p["warm"]["cpu_s"], 1),
              f"{p['cold_over_warm']:.2f}x"] for k, p in enumerate(pairs)], "lrrrrr") + \
            f"\n\nFirst run over second: **{c['cold_over_warm']:.2f}x**" + \
            (f", the median of {len(pairs)} pairs" if len(pairs) > 1 else "") + \
            f" (target at most {c['target']:.1f}x: " \
            f"**{'met' if c['target_met'] else 'not met'}**)."
    return text + "\n\n" + source(r)


def cluster(get: Loader) -> str:
    r = get("cluster")
    x = r["results"]
    rows = [[str(row["workers"]), f"**{n(row['wall_s'], 1)}**", n(row["play_s"], 1),
             n(row["serial_s"], 1), f"{row['blocks']} ({row['tasks']} tasks)",
             n(row["overhead_per_block_s"], 2), f"**{row['speedup']:.2f}x**",
             n(row.get("projected_wall_s"), 1), f"{row['profit_gain']:.4f}"]
            for row in x["rows"]]
    projected = [[str(p["cpus"]), str(p["blocks"]), str(p["busy_cpus"]), n(p["wall_s"], 1),
                  f"{p['speedup']:.2f}x"] for p in x["projection"]]
    two = next((row for row in x["rows"] if row["workers"] == 2), None)
    target = "" if two is None else \
        f"\n\nTarget (2 worker nodes at least 1.6x one): " \
        f"**{'met' if two['speedup'] >= 1.6 else 'not met'}** ({two['speedup']:.2f}x)."
    return table(["worker nodes (1 CPU each)", "wall s", "play s", "serial s", "blocks",
                  "overhead per block s", "speedup", "model's wall s", "profit gain Delta"],
                 rows, "lrrrrrrrr") + target + "\n\nProjected from the one-node row:\n\n" + \
        table(["worker CPUs", "blocks", "CPUs with a block", "wall s", "speedup"], projected,
              "rrrrr") + "\n\n" + source(r)


def population_throughput(get: Loader) -> str:
    r = get("population_throughput")
    x = r["results"]
    labels = {"single": "`single` (no population)", "sync": "`sync` (market e -> member e mod K)",
              "resample": "`resample` (markets redrawn every iteration)",
              "resample_mixed": "`resample_mixed` (agents redrawn every iteration)"}
    rows = [[label, f"**{n(x[f'{k}_env_steps_per_s'])}**", n(x[f"{k}_compile_s"], 1)]
            for k, label in labels.items()]
    ratios = table(["ratio", "measured", "target"], [
        ["sync / single", f"**{x['sync_over_single']:.3f}**", ">= 0.8"],
        ["resample / sync", f"**{x['resample_over_sync']:.3f}**", ">= 0.6"],
        ["resample_mixed / sync", f"**{x['resample_mixed_over_sync']:.3f}**", ">= 0.6"]],
        "lrl")
    return table(["setting", "env steps/s", "compile s"], rows) + "\n\n" + ratios + "\n\n" \
        + source(r)


def pbt_efficacy(get: Loader) -> str:
    r = get("pbt_efficacy")
    x = r["results"]
    rows = [["population-mean regret", f"**{g(x['regret_pbt'])}**", g(x["regret_fixed"]),
             f"**{x['ratio']:.3f}** (target <= 0.5: "
             f"{'met' if x['ratio'] <= 0.5 else 'not met'})"],
            ["best member's regret", g(x["best_regret_pbt"]), g(x["best_regret_fixed"]), ""]]
    return table(["", "PBT", "fixed learning rates", "PBT / fixed"], rows, "lrrl") \
        + f"\n\n{x['seeds']} seeds x {x['members']} members, {n(x['env_steps'])} env steps per " \
        f"run; {x['seconds_pbt']:.1f} s with PBT, {x['seconds_fixed']:.1f} s without, " \
        f"{x['compile_s']:.1f} s of compiling.\n\n" + source(r)


def device_throughput(get: Loader) -> str:
    r = get("device_throughput_quick")
    x = r["results"]
    return table(["device", "best bench_b agent steps/s", "compile s per bench_b size",
                  "large market compile s", "wall s"],
                 [[x["device"], n(x["best_agent_steps_per_s"]), x["env_only_compile_s"],
                   n(x["large_market_compile_s"], 1), n(x["wall_s"])]], "lrrrr") \
        + "\n\n" + source(r)


def offline(get: Loader) -> str:
    r = get("offline")
    x = r["results"]
    ope = x["ope"]
    rows = [
        ["(a) FQE estimate vs true discounted value (gamma 0.9) of the fixed price 1.6",
         f"{x['fqe_estimate']:.4f} vs {x['true_value']:.4f} "
         f"({100 * x['fqe_relative_error']:.2f}%)",
         "within 3%: " + ("met" if x["fqe_relative_error"] <= 0.03 else "not met")],
        ["(b) offline policy vs the noisy heuristic, simulated discounted value",
         f"IQL {x['offline_policy_value']:.3f}, CQL {x['cql_policy_value']:.3f} vs "
         f"{x['heuristic_value']:.3f}",
         "beats it: " + ("met" if x["offline_policy_value"] > x["heuristic_value"]
                         else "not met")],
        ["(b) IQL policy exported to ONNX, onnxruntime vs the jitted policy on every logged "
         "observation", f"max abs diff {x['onnx_max_abs_diff']:.1e}",
         "<= 1e-5: " + ("met" if x["onnx_max_abs_diff"] <= 1e-5 else "not met")],
        [f"(c) OPE bias / RMSE over {x['ope_batches']} batches of {x['ope_rows_per_batch']:,} "
         f"rows (true {x['ope_true_value']:.4f}, mean ESS {x['ope_mean_ess']:.0f})",
         ", ".join(f"{k.upper()} {v['bias']:+.4f} / {v['rmse']:.4f}" for k, v in ope.items()),
         ""],
        ["(d) `fit` updates/s (batch 256, 256x256)",
         f"CQL {x['fit_updates_per_s']:.1f} (10 sampled actions per state), "
         f"IQL {x['fit_updates_per_s_iql']:.0f}", ""]]
    return table(["check", "result", "target"], rows, "lll") \
        + f"\n\n{n(x['seconds'])} s in all.\n\n" + source(r)


def offline_vs_d3rlpy(get: Loader) -> str:
    r = get("offline_vs_d3rlpy")
    x = r["results"]
    return table(["transitions", "jaxmarket CQL updates/s", "d3rlpy CQL updates/s", "ratio"],
                 [[n(x["rows"]), f"**{x['jaxmarket_updates_per_s']:.1f}**",
                   f"{x['d3rlpy_updates_per_s']:.1f}", f"{x['ratio']:.2f}"]]) \
        + "\n\n" + source(r)


def sb3_vec(get: Loader) -> str:
    r = get("sb3_vec")
    x = r["results"]
    rows = [[f"`make_sb3_vec_env` ({x['n_envs']} markets, one jitted call per step)",
             f"**{n(x['jitted.env_steps_per_s'])}**", n(x["jitted.step_env_steps_per_s"]),
             n(x["jitted.setup_s"], 1)],
            [f"`DummyVecEnv` of {x['n_envs']} `make_gymnasium_env` (one call per env)",
             n(x["dummy.env_steps_per_s"]), n(x["dummy.step_env_steps_per_s"]),
             n(x["dummy.setup_s"], 1)],
            ["jitted / Dummy", f"**{x['ratio']:.2f}x** (rounds "
             + ", ".join(f"{v:.2f}" for v in x["ratios"]) + ")",
             f"**{x['step_ratio']:.1f}x**", ""]]
    p = x["ppo"]
    return table(["vec env", "SB3 PPO env steps/s (median)", "`venv.step` alone, env steps/s",
                  "setup s (compiles included)"], rows) \
        + f"\n\n`{x['config']}` ({x['group']}); PPO n_steps {p['n_steps']}, batch " \
        f"{p['batch_size']}, {p['n_epochs']} epochs, {p['rounds']} rounds of " \
        f"{n(p['timesteps_per_round'])} env steps per side; stable-baselines3 " \
        f"{x['versions.stable_baselines3']}, torch {x['versions.torch']} " \
        f"({x['versions.torch_threads']} threads).\n\n" + source(r)


def poi_efficacy(get: Loader) -> str:
    r = get("poi_efficacy")
    x = r["results"]
    rows = []
    for name, v in x["variants"].items():
        label = f"`{name}`" + (" (baseline)" if name == "zero" else
                               " (default)" if name == x["default"] else "")
        for ph in range(2):
            a, w = v["auc_ratio_ci"][ph], v["reward_ratio_ci"][ph]
            strong = "**" if name == x["default"] else ""
            rows.append([label if ph == 0 else "", ph + 1,
                         f"{strong}{v['auc_ratio'][ph]:.3f}{strong} [{a[0]:.3f}, {a[1]:.3f}]",
                         f"{strong}{v['reward_ratio'][ph]:.3f}{strong} [{w[0]:.3f}, {w[1]:.3f}]",
                         n(v["convergence_iteration"][ph]), f"{v['asymptotic_error'][ph]:.4f}",
                         f"{v['auc'][ph]:.4f}", f"{v['reward'][ph]:.4f}"])
    d = x["variants"][x["default"]]
    met = all(d["auc_ratio"][ph] <= 0.8 and d["reward_ratio"][ph] >= 0.95 for ph in range(2))
    return table(["variant", "phase", "AUC ratio (95% CI)", "reward ratio (95% CI)",
                  "convergence it.", "asymptotic error", "AUC", "reward"], rows, "lrllrrrr") \
        + f"\n\n{x['seeds']} seeds. Target (AUC ratio <= 0.8 and reward ratio >= 0.95 in both " \
        f"phases, for the default `{x['default']}`): **{'met' if met else 'not met'}**.\n\n" \
        + source(r)


def ground_truths(get: Loader) -> str:
    r = get("ground_truths")
    rows = [[f"`{x['scenario']}`", f"{x['theory']:.4f}", f"**{x['learned']:.4f}**",
             f"{x['abs_error']:+.4f}", f"{100 * x['rel_error']:+.2f} %"
             + (f" ({x['error_over_gap']:+.4f} of the Nash-monopoly gap)"
                if "error_over_gap" in x else ""),
             f"{x['max_seed_abs_error']:.4f}", f"{x['played_price']:.4f}",
             f"{min(x['per_seed']):.4f}-{max(x['per_seed']):.4f}",
             f"{x['profit_gain']:.3f}" if "profit_gain" in x else "",
             f"{x['final_stddev']:.3g}", n(x["iterations"]), x["seeds"], n(x["wall_s"], 1)]
            for x in r["results"]]
    return table(["scenario", "theory", "learned", "error", "rel. error", "max per-seed error",
                  "played", "per seed", "profit gain", "final stddev", "iterations", "seeds",
                  "wall s"], rows) + "\n\n" + source(r)


def train_throughput_devices(get: Loader) -> str:
    r = get("train_throughput_devices")
    rows = [[row["devices"], n(row["env_steps_per_s"]), n(row["env_steps_per_s_best"]),
             n(row["cores_used"], 2), f"{row['speedup']:.2f}x" if "speedup" in row else "",
             n(row["compile_s"], 1)] for row in r["results.by_devices"]]
    return table(["devices", "env steps/s", "best call", "cores used", "vs the first row",
                  "compile s"], rows) + "\n\n" + source(r)


def throughput_devices(get: Loader) -> str:
    one, two = get("throughput_devices1"), get("throughput_devices2")
    rows = [[x["results.devices"], n(x["results.env_steps_per_s"]), n(x["results.cores_used"], 2)]
            for x in (one, two)]
    rows.append(["2 / 1", f"{two['results.env_steps_per_s'] / one['results.env_steps_per_s']:.2f}x",
                 ""])
    return table(["devices", "env steps/s", "cores used"], rows) + "\n\n" + source(one, two)


def device_equality(get: Loader) -> str:
    r = get("device_equality")
    yes = lambda b: "yes" if b else "no"   # noqa: E731
    ynn, env = r["results.ynn_sum_equals_sequential"], r["results.env_step_32_vs_8_markets_bitwise"]
    rows = [[f"1. `jnp.sum(x, -1)` over `[{k}, 8]` equals the sequential sum", yes(ynn["default"][k]),
             yes(ynn["no_ynn"][k])] for k in ("511", "512")]
    rows += [["1. bench_b `env.step` rewards: 32 markets vs the first 8 of them",
              yes(env["default"]), yes(env["no_ynn"])],
             ["2. `jnp.sum` of 4,096 floats: 1 vs 8 devices",
              yes(r["results.sum_1_vs_8_devices_bitwise"]), ""],
             ["3. a `ppo_bandit` update: 1 vs 8 devices", "",
              yes(r["results.ppo_bandit_update_1_vs_8_devices_bitwise"])]]
    runs = [[f"`{name}`", f"{len(t['arrays_differing'])} of {t['arrays']}",
             f"{len(t['columns_differing'])} of {t['metric_columns']}",
             f"{t['max_relative_difference']:.1e}"]
            for name, t in r["results.training_1_vs_8_devices"].items()]
    return table(["finding: bitwise equal?", "default", "without YNNPACK fusions"], rows,
                 "lll") + "\n\n" + "4. Whole training runs, 12 iterations on 1 and on 8 " \
        "devices:\n\n" + table(["scenario", "runner arrays that differ",
                                 "`metrics.csv` columns that differ",
                                 "largest relative difference"], runs, "lrrr") \
        + "\n\n" + source(r)


def startup(get: Loader) -> str:
    r = get("startup")
    x = r["results"]
    rows = [[f"`{v['command']}`", f"**{v['median_s']:.2f}**", f"{v['min_s']:.2f}",
             v["exit_code"], ", ".join(v["heavy_imported"]) or "none"]
            for k, v in x.data["results"].items() if isinstance(v, dict)]
    return table(["command", "median wall s", "fastest s", "exit code", "heavy libraries imported"],
                 rows, "lrrrl") + f"\n\n{x['runs']} runs of each command.\n\n" + source(r)


def roofline(get: Loader) -> str:
    r = get("roofline")
    x = r["results"]
    names = {"matmul_gflops": "matmul", "fma_gflops": "FMA chains", "copy_gbs": "copy",
             "reduce_gbs": "reduce"}
    rows = [[label, f"**{x[k]['value']:.1f}** {x[k]['unit']}", f"{x[k]['best']:.1f}",
             f"{100 * x[k]['spread']:.0f}%", len(x[k]["samples"])]
            for k, label in names.items()]
    return table(["probe", "median", "best", "spread", "calls"], rows) + "\n\n" + source(r)


def cost_model(get: Loader) -> str:
    rf, pm = get("roofline"), get("ppo_market")
    mk = rf["results.market_step"]
    peak_mm, copy = rf["results.matmul_gflops.value"], rf["results.copy_gbs.value"]
    slots, T = pm["results.agent_slots"], pm["results.rollout_length"]
    ppo_flop = 240e3   # per agent-step, counted by hand (below the table)
    ppo_roof_us = 1e6 * ppo_flop / (peak_mm * 1e9)
    per_step_us = lambda ms: 1e3 * ms / (slots * T)   # noqa: E731
    market_us = per_step_us(pm["results.ms_per_iteration"])
    cart_us = per_step_us(pm["results.cartpole_ms_per_iteration"])
    per_slot_us = 1e6 / pm["results.per_slot_agent_steps_per_s"]
    per_slot_roof_us = 1e6 * 700e3 / (copy * 1e9)
    rows = [
        [f"market step, per consumer x seller x product cell (bench_b, "
         f"{mk['cells_per_market']:,} cells, {mk['us_per_env_step']:.2f} us per market step, "
         f"{mk['cores_used']:.2f} cores busy)", f"{mk['value']:.2f} ns",
         f"{mk['flops_per_cell']} flops, {mk['bytes_per_cell']} bytes (XLA's `cost_analysis()`)",
         f"{mk['roofline']['ns']:.2f} ns ({mk['roofline']['bound']})",
         f"**{mk['distance']:.1f}**"],
        ["PPO training, per agent-step, `ppo` defaults (`ppo_market.py`, grouped)",
         f"{market_us:.2f} us", "~240 kFLOP (by hand, below)",
         f"{ppo_roof_us:.2f} us (compute)", f"{market_us / ppo_roof_us:.1f}"],
        ["PPO training, per agent-step, `group_by_policy: false`", f"{per_slot_us:.1f} us",
         "~240 kFLOP; ~700 KB moved (per-sample parameter copies and gradients)",
         f"{per_slot_roof_us:.1f} us (memory)", f"{per_slot_us / per_slot_roof_us:.1f}"],
        ["PPO CartPole, per agent-step (same run)", f"{cart_us:.2f} us",
         "~240 kFLOP (same networks; discrete head)", f"{ppo_roof_us:.2f} us (compute)",
         f"{cart_us / ppo_roof_us:.1f}"]]
    return table(["unit of work", "measured", "count per unit", "roofline (these probes)",
                  "x roofline"], rows, "lrlrr") + "\n\n" + source(rf, pm)


BLOCKS: dict[str, Callable[[Loader], str]] = {f.__name__: f for f in (
    throughput, throughput_against_minimal, throughput_breakdown, throughput_sweep,
    train_throughput, train_throughput_profile, bandit_update, ppo_cartpole, ppo_market,
    ppo_market_profile, sb3_vec, calvano, sessions_throughput, calvano_cpu, cluster, population_throughput,
    pbt_efficacy, device_throughput, offline, offline_vs_d3rlpy, poi_efficacy, ground_truths,
    train_throughput_devices, throughput_devices, device_equality, startup, roofline,
    cost_model)}


# -- rendering and checking -----------------------------------------------------------

def render_block(name: str, results_dir: Path = RESULTS) -> str:
    if name not in BLOCKS:
        raise MissingResult(f"no renderer for the block {name!r} (benchmarks/render_docs.py)")
    return BLOCKS[name](lambda file: load(results_dir, file)).rstrip("\n")


def render(text: str, results_dir: Path = RESULTS, problems: list[str] | None = None) -> str:
    """``text`` with every results block rendered from ``results_dir``. A block that
    cannot be rendered raises :class:`MissingResult`, or with a ``problems`` list is
    left as it is and its problem appended."""
    def one(m: re.Match) -> str:
        try:
            body = render_block(m[1], results_dir)
        except MissingResult as err:
            if problems is None:
                raise
            problems.append(f"block {m[1]}: {err}")
            return m[0]
        return f"<!-- results:{m[1]} -->\n{body}\n<!-- /results:{m[1]} -->"
    return BLOCK.sub(one, text)


def check(page: Path = PAGE, results_dir: Path = RESULTS) -> list[str]:
    """What drifted: blocks whose text differs from their rendering, results files
    missing a key, blocks without a renderer, renderers without a block."""
    text = Path(page).read_text()
    problems, seen = [], []
    for m in BLOCK.finditer(text):
        name = m[1]
        seen.append(name)
        try:
            want = render_block(name, results_dir)
        except MissingResult as err:
            problems.append(f"block {name}: {err}")
            continue
        if m[2].rstrip("\n") != want:
            problems.append(f"block {name}: the page differs from its results files "
                            f"(python benchmarks/render_docs.py rewrites it)")
    opened = len(re.findall(r"<!-- results:[\w-]+ -->", text))
    if opened != len(seen):
        problems.append(f"{opened - len(seen)} results block(s) without their closing marker")
    problems += [f"block {name}: not on the page" for name in BLOCKS if name not in seen]
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/render_docs.py",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="report drift and exit 1 instead of rewriting the page")
    ap.add_argument("--page", default=str(PAGE), help="the markdown page (docs/benchmarks.md)")
    ap.add_argument("--results", default=str(RESULTS), help="the results folder")
    args = ap.parse_args(argv)
    if args.check:
        problems = check(Path(args.page), Path(args.results))
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    page, problems = Path(args.page), []
    page.write_text(render(page.read_text(), Path(args.results), problems))
    for p in problems:
        print(f"render_docs.py: {p} (the block is left as it was)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
