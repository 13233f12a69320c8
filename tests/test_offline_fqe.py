"""FQE on a tiny MDP matches the closed-form value of the evaluated policy; on the market
benchmark's logs it matches the simulator's value of a fixed price."""

import jax.numpy as jnp
import numpy as np

from jaxmarket.offline import fqe_value, make_dataset

GAMMA = 0.8
# 3 states, 2 actions: reward r[s, a], transition T[s, a, s']
R = np.array([[1.0, 0.0], [0.0, 2.0], [0.5, 0.5]])
T = np.array([[[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]],
              [[0.0, 0.2, 0.8], [0.5, 0.5, 0.0]],
              [[1.0, 0.0, 0.0], [0.3, 0.3, 0.4]]])
PI = np.array([[0.3, 0.7], [0.9, 0.1], [0.5, 0.5]])   # target policy pi(a | s)


def closed_form_value(s0: int) -> float:
    """V = (I - gamma P_pi)^-1 r_pi, solved exactly."""
    r_pi = (PI * R).sum(1)
    p_pi = np.einsum("sa,sat->st", PI, T)
    v = np.linalg.solve(np.eye(3) - GAMMA * p_pi, r_pi)
    return float(v[s0])


def test_fqe_on_a_tiny_mdp_matches_the_linear_bellman_solution():
    rng = np.random.default_rng(0)
    n = 4000
    s = rng.integers(0, 3, n)                   # uniform coverage of states and actions
    a = rng.integers(0, 2, n)
    s2 = np.array([rng.choice(3, p=T[i, j]) for i, j in zip(s, a)])
    eye = np.eye(3, dtype=np.float32)
    values = [[0.0], [1.0]]
    ds = make_dataset(eye[s], np.asarray(values)[a], R[s, a], eye[s2],
                      step=np.where(s == 0, 0, 1),      # initial states: state 0
                      action_index=a, meta={"discrete": True, "action_values": values})
    pi = jnp.asarray(PI, jnp.float32)
    policy = lambda obs: obs @ pi
    est = fqe_value(ds, policy, gamma=GAMMA, steps=3000, hidden=(32,), learning_rate=3e-3,
                    target_every=50)
    truth = closed_form_value(0)
    assert abs(est - truth) / truth < 0.02, (est, truth)
