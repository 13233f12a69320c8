"""Offline RL and off-policy evaluation on market logs (docs/offline.md).

    collect(config, steps, out)            make a dataset from a scenario (also the CLI
                                           python -m jaxmarket.collect)
    load_dataset(path) / save_dataset      the native chunked format; load_d4rl / save_d4rl;
                                           jaxmarket.offline.minari_io: save_minari / load_minari
    make_algo(name, dataset, **hyper)      bc, cql, iql, td3_bc, dm, dr sized from the data
    fit(algo, dataset, evaluators=..., callbacks=..., stop=Stop(...), logger=...)
    SimulatorValue, FQE, BanditOPE, scorers     evaluators fn(algo, state)
    jaxmarket.offline.cv: split_episodes, kfold, grid_search (grid x folds x seeds, vmapped)
    jaxmarket.offline.onnx_export: export_onnx, onnx_max_abs_diff
"""

from jaxmarket.offline.algos import ALGOS, Algo, make_algo
from jaxmarket.offline.collect import collect
from jaxmarket.offline.d4rl import load_d4rl, save_d4rl
from jaxmarket.offline.dataset import Dataset, DatasetError, make_dataset, save_dataset
from jaxmarket.offline.fit import FitResult, fit
from jaxmarket.offline.formats import load_dataset
from jaxmarket.offline.fqe import FQE, fqe_value
from jaxmarket.offline.ope import BanditOPE, bias_rmse, ope_estimates
from jaxmarket.offline.reservoir import reservoir_add, reservoir_init
from jaxmarket.offline.scorers import action_difference, td_error, value_estimate
from jaxmarket.offline.simulate import SimulatorValue, policy_value
from jaxmarket.offline.stop import Stop

__all__ = [
           "ALGOS",
           "FQE",
           "Algo",
           "BanditOPE",
           "Dataset",
           "DatasetError",
           "FitResult",
           "SimulatorValue",
           "Stop",
           "action_difference",
           "bias_rmse",
           "collect",
           "fit",
           "fqe_value",
           "load_d4rl",
           "load_dataset",
           "make_algo",
           "make_dataset",
           "ope_estimates",
           "policy_value",
           "reservoir_add",
           "reservoir_init",
           "save_d4rl",
           "save_dataset",
           "td_error",
           "value_estimate",
]
