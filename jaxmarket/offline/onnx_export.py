"""The learned deterministic policy as an ONNX model (``onnx``), checked with
``onnxruntime`` against the jitted ``algo.policy``.

Every offline policy here is observation standardisation, an MLP (``Dense`` + ReLU
layers) and a head, so the graph is built with ``onnx.helper`` from the flax parameters:

    obs [N, D] -> (obs - mean) / std -> [Gemm -> Relu]* -> Gemm -> head -> action [N, P]

head, continuous (``bc``, ``td3_bc``, ``iql``, ``cql``): ``tanh`` of the first ``P``
outputs (the policy mean), then ``low + (u + 1) / 2 (high - low)``; discrete (``bc``,
``iql``, ``cql``, ``dm``, ``dr``): ``ArgMax`` over the outputs (logits or Q-values), then a
``Gather`` of the grid ``action_values``. A dataset without observations (a plain bandit)
feeds the MLP a constant 1, as ``MLP`` does. (jax2onnx, the general converter, pins
orbax-checkpoint < 0.11.37, which clashes with the orbax this project uses, so it is
not used.)

``export_onnx(algo, state, path)`` writes the model atomically; ``onnx_max_abs_diff(algo,
state, path, obs)`` runs it with onnxruntime and returns ``max |onnx - jax|``.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np

from jaxmarket.config.errors import ConfigError


def _dense_layers(tree) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(kernel, bias), ...]`` of an ``MLP``'s params, in layer order."""
    while "Dense_0" not in tree:
        subs = [v for k, v in tree.items() if isinstance(v, dict)]
        if len(subs) != 1:
            raise ConfigError("export", "an unexpected parameter tree", "an MLP policy")
        tree = subs[0]
    n = len([k for k in tree if k.startswith("Dense_")])
    return [(np.asarray(tree[f"Dense_{i}"]["kernel"], np.float32),
             np.asarray(tree[f"Dense_{i}"]["bias"], np.float32)) for i in range(n)]


def policy_key(algo) -> str:
    """Where the policy network lives in the algorithm's state (a ``ConfigError`` for an
    algorithm whose policy is not one network)."""
    name, discrete = algo.name, algo.discrete
    key = {("bc", False): "params", ("bc", True): "params", ("td3_bc", False): "pi",
           ("iql", False): "pi", ("iql", True): "pi", ("cql", False): "pi",
           ("cql", True): "q", ("dm", True): "model", ("dr", True): "pi"}.get((name, discrete))
    if key is None:
        raise ConfigError("--export-onnx", f"{name} ({'discrete' if discrete else 'continuous'})",
                          "bc, td3_bc, iql, cql, or dm / dr on a discrete dataset")
    return key


def policy_network(algo, state) -> tuple[list, str]:
    """(the policy MLP's layers, head: ``"tanh"`` or ``"argmax"``)."""
    key = policy_key(algo)
    return _dense_layers(jax.device_get(state[key])), ("argmax" if algo.discrete else "tanh")


def build_model(algo, state):
    """The ONNX ``ModelProto`` of ``algo.policy(state, .)``."""
    from onnx import TensorProto, helper, numpy_helper

    layers, head = policy_network(algo, state)
    norm = jax.device_get(algo.norm)
    D = int(np.asarray(norm.obs_mean).shape[0])
    P = int(np.asarray(norm.act_low).shape[0])
    inits, nodes = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    if D == 0:   # no observation: a constant 1 per row
        nodes += [helper.make_node("ReduceSum", ["obs"], ["s"], keepdims=1),
                  helper.make_node("Mul", ["s", const("zero", 0.0)], ["z"]),
                  helper.make_node("Add", ["z", const("one", 1.0)], ["x0"])]
    else:
        nodes += [helper.make_node("Sub", ["obs", const("mean", norm.obs_mean)], ["c"]),
                  helper.make_node("Div", ["c", const("std", norm.obs_std)], ["x0"])]
    x = "x0"
    for i, (w, b) in enumerate(layers):
        nodes.append(helper.make_node("Gemm", [x, const(f"W{i}", w), const(f"b{i}", b)], [f"h{i}"]))
        x = f"h{i}"
        if i < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    if head == "tanh":
        if layers[-1][0].shape[1] != P:   # a mean and a log-std: keep the mean
            inits += [numpy_helper.from_array(np.asarray(v, np.int64), n) for n, v in
                      (("s0", [0]), ("s1", [P]), ("ax", [1]))]
            nodes.append(helper.make_node("Slice", [x, "s0", "s1", "ax"], ["head_mean"]))
            x = "head_mean"
        low, high = np.asarray(norm.act_low), np.asarray(norm.act_high)
        nodes += [helper.make_node("Tanh", [x], ["u"]),
                  helper.make_node("Mul", ["u", const("half", (high - low) / 2)], ["v"]),
                  helper.make_node("Add", ["v", const("mid", (high + low) / 2)], ["action"])]
    else:
        nodes += [helper.make_node("ArgMax", [x], ["k"], axis=1, keepdims=0),
                  helper.make_node("Gather", [const("values", algo.action_values), "k"],
                                   ["action"], axis=0)]
    graph = helper.make_graph(
        nodes, f"jaxmarket_{algo.name}_policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["N", D])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["N", P])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="jaxmarket.offline")
    model.ir_version = 8
    return model


def export_onnx(algo, state, path: str | Path) -> Path:
    """Write the policy to ``path`` (``.onnx``), checked by ``onnx.checker``, atomically."""
    try:
        import onnx
    except ModuleNotFoundError:
        raise ConfigError("--export-onnx", str(path), "onnx installed: pip install "
                          "'jaxmarket[onnx]'") from None
    path = Path(path)
    if path.suffix != ".onnx":
        raise ConfigError("--export-onnx", str(path), "a file name ending in .onnx")
    model = build_model(algo, state)
    onnx.checker.check_model(model)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        onnx.save(model, tmp)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def onnx_max_abs_diff(algo, state, path: str | Path, obs: np.ndarray) -> float:
    """``max |onnxruntime(path)(obs) - algo.policy(state, obs)|``."""
    import onnxruntime as ort

    obs = np.asarray(obs, np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(["action"], {"obs": obs})[0]
    want = np.asarray(jax.jit(algo.policy)(state, obs))
    return float(np.abs(got - want).max())


__all__ = ["build_model", "export_onnx", "onnx_max_abs_diff", "policy_key", "policy_network"]
