"""Does population-based training find a learning rate the hand-picked grid misses?

Scenario: the logit monopoly (``configs/logit_monopoly.yaml``: one seller, multinomial
logit demand, closed-form optimum ``p* = jaxmarket.market.economics.monopoly_price() = 1.8020``),
its ``ppo_bandit`` seller given a population of ``K`` members per seed whose learning
rates start log-spaced over four decades (``pbt.init: {learning_rate: log_spaced}``,
bounds ``[1e-5, 1e-1]``). Two runs at equal env steps, same seeds:

* ``fixed``: the same population, PBT never acts (``pbt.start`` beyond the run), so each
  member keeps its initial learning rate;
* ``pbt``: every ``period`` iterations the bottom members of each seed copy a top
  member's parameters and Adam state and perturb its learning rate.

Regret, per seed and member: ``pi(p*) - pi(p_k)``, ``pi`` the closed-form profit
(``logit_profits``) and ``p_k`` member ``k``'s final policy mean price (clipped to the
action bounds as the market clips it). Reported: ``regret_pbt`` / ``regret_fixed`` = the
mean over seeds of the **population mean** regret (every member counts: what a population
trained with PBT delivers), and ``best_regret_*`` = the mean over seeds of the best
member's regret (the member chosen with hindsight, by true profit). Target:
``regret_pbt <= 0.5 x regret_fixed``.

    python benchmarks/pbt_efficacy.py --json
    python benchmarks/pbt_efficacy.py --iterations 2000 --seeds 16 --members 8

With ``--json`` the last printed line is JSON with the keys ``regret_pbt``,
``regret_fixed``, ``best_regret_pbt``, ``best_regret_fixed``, ``ratio``, ``seeds``,
``members``, ``env_steps`` (per run), ``iterations`` and ``seconds``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from compile_timer import CompileTimer  # noqa: E402

from jaxmarket.config.loader import load_config  # noqa: E402
from jaxmarket.market.economics import logit_profits, monopoly_price  # noqa: E402
from jaxmarket.train.plan import resolve
from jaxmarket.train.trainer import Trainer  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (benchmarks/record.py: --write, --json-out)


def scenario(iterations: int, seeds: int, members: int, envs_per_member: int, period: int,
             pbt: bool) -> dict:
    config = load_config(ROOT / "configs" / "logit_monopoly.yaml")
    config["train"].update(num_iterations=iterations, num_seeds=seeds, chunk_size=iterations,
                           num_envs=members * envs_per_member, checkpoint_every=1000)
    config["learners"]["seller"].update(population=members, pbt={
        "period": period,
        "start": 2 * period if pbt else iterations + 1,   # fixed: PBT never acts
        "hyperparams": {"learning_rate": [1e-5, 1e-1]},
        "init": {"learning_rate": "log_spaced"},
    })
    return config


def regrets(config: dict) -> tuple[np.ndarray, float, dict]:
    """Train ``config``; per-seed population-mean and best-member regret, seconds."""
    with tempfile.TemporaryDirectory() as tmp, CompileTimer() as compiled:
        trainer = Trainer(resolve(copy.deepcopy(config)), Path(tmp) / "run")
        t0 = time.perf_counter()
        runner = trainer.initial_runner()
        runner, _ = trainer.chunk_fn(config["train"]["num_iterations"])(runner)
        state = runner.learners["seller"]
        mean = np.asarray(state.params["mean"])[:, 0]                     # [S K]
        lr = np.asarray(state.hyper["learning_rate"])
        seconds = time.perf_counter() - t0
    S, K = config["train"]["num_seeds"], config["learners"]["seller"]["population"]
    seller = config["market"]["sellers"][0]
    price = np.clip(mean, seller["low"], seller["high"]).reshape(S, K)
    optimum = float(logit_profits(np.array([monopoly_price()]))[0])
    regret = optimum - logit_profits(price[..., None])[..., 0]          # [S, K]
    return regret, seconds, {"final_lr": lr.reshape(S, K), "compile_s": compiled.seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=1200)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--envs-per-member", type=int, default=2)
    ap.add_argument("--period", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    record.add_arguments(ap, "pbt_efficacy")
    args = ap.parse_args(argv)
    out = {}
    for name, pbt in (("fixed", False), ("pbt", True)):
        config = scenario(args.iterations, args.seeds, args.members, args.envs_per_member,
                          args.period, pbt)
        regret, seconds, extra = regrets(config)
        out[f"regret_{name}"] = float(regret.mean(1).mean())
        out[f"best_regret_{name}"] = float(regret.min(1).mean())
        out[f"seconds_{name}"] = round(seconds, 1)
        out["compile_s"] = round(out.get("compile_s", 0.0) + extra["compile_s"], 2)
        print(f"{name}: population-mean regret {regret.mean(1).mean():.5f}, best member "
              f"{regret.min(1).mean():.5f} (per seed: {np.round(regret.mean(1), 4).tolist()}); "
              f"final learning rates of seed 0: {np.round(extra['final_lr'][0], 6).tolist()}; "
              f"{seconds:.1f} s")
    env_steps = args.iterations * args.seeds * args.members * args.envs_per_member
    out.update(ratio=out["regret_pbt"] / out["regret_fixed"], seeds=args.seeds,
               members=args.members, env_steps=env_steps, iterations=args.iterations)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"ratio pbt / fixed: {out['ratio']:.3f} (target <= 0.5) at {env_steps} env steps")
    record.write(args, out, __file__, argv, "pbt_efficacy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
