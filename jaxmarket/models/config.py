"""``learners.<group>.external_model`` (and its ``poi`` block), validated before
compiling."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmarket.config.errors import ConfigError
from jaxmarket.config.fields import Field, check_mapping, lookup_kind
from jaxmarket.learners.base import Transition
from jaxmarket.market.state import current_actions
from jaxmarket.models import demand as _demand, rival as _rival  # noqa: F401  (register the shipped kinds)
from jaxmarket.models.base import MODELS, ModelContext
from jaxmarket.models.poi import POI_FIELDS

KEY = "external_model"   # the key in learners.<group> (not a learner setting)

EVAL_FIELDS = {
    "eval_every": Field("int", 10, low=1, doc="iterations between ground-truth evaluations"),
    "eval_grid": Field("int", 21, low=2, doc="held-out own prices, evenly spaced on the bounds"),
    "eval_random": Field("int", 64, low=0,
                         doc="samples of the uniformly-random-agent error (0: not computed)"),
    "poi": Field("any", None, optional=True, doc="the exploration bonus {kind: ..., beta: ...}"),
    "poi_obs": Field("any", None, optional=True,
                     doc="the POI field at k sampled inputs, appended to the group's "
                         "observation {k: 8, sampler: grid}"),
}

POI_OBS_FIELDS = {
    "k": Field("int", 8, low=1, doc="sampled model inputs (features appended)"),
    "sampler": Field("choice", "grid", choices=("grid", "replay", "uniform"),
                     doc="grid: own price on a fixed grid, rivals at their current prices; "
                         "replay: inputs drawn from the last iteration's experience; "
                         "uniform: own price uniform (redrawn every iteration)"),
    "emb_size": Field("int", 0, low=0, doc="0: the k raw values; N: through a learned "
                                           "Dense(N) + tanh inside the policy"),
    "normalize": Field("choice", "none", choices=("none", "running"),
                       doc="running: (poi - mu) / sigma with the bonus's running statistics"),
}

# learner kinds whose policy reads observations as features (and can embed the tail)
POI_OBS_LEARNERS = ("ppo",)

POI_COMMON = {
    "beta": Field("float", 0.1, low=0.0, doc="bonus weight: r + beta * normalize(poi)"),
    "beta_schedule": Field("choice", "constant", choices=("constant", "linear", "exp")),
    "beta_final": Field("float", 0.0, low=0.0, doc="linear/exp: the value beta decays to"),
    "decay_iterations": Field("int", 1000, low=1,
                              doc="linear: iterations to reach beta_final; exp: time constant"),
    "warmup": Field("int", 0, low=0, doc="iterations without a bonus at the start"),
    "normalize": Field("choice", "running", choices=("running", "none"),
                       doc="(poi - running mean) / running std, per seed"),
    "normalize_horizon": Field("int", 50, low=1,
                               doc="iterations the running statistics remember (at most)"),
    "restart_on_surprise": Field("float", None, optional=True, low=1.0, low_open=True,
                                 doc="restart the beta schedule when the batch error "
                                     "exceeds this multiple of its moving average"),
    "target": Field("choice", "action", choices=("action", "state"),
                    doc="action: the POI of the input the action taken produced; state: of "
                        "the input of the state reached (make_inputs of the next prices)"),
}


@dataclass(frozen=True)
class ModelConfig:
    kind: str
    settings: tuple          # sorted (name, value) pairs of the model's own settings
    eval_every: int
    eval_grid: int
    eval_random: int
    poi: tuple | None        # sorted (name, value) pairs, kind included, or None
    poi_obs: tuple | None = None   # sorted (name, value) pairs, or None

    @property
    def poi_obs_settings(self) -> dict | None:
        return None if self.poi_obs is None else dict(self.poi_obs)

    @property
    def model_settings(self) -> dict:
        return dict(self.settings)

    @property
    def poi_settings(self) -> dict | None:
        return None if self.poi is None else dict(self.poi)


def split_model(raw: Any) -> tuple[Any, Any]:
    """A group's learner config -> (the rest, its external_model block or None)."""
    if not isinstance(raw, Mapping) or KEY not in raw:
        return raw, None
    return {k: v for k, v in raw.items() if k != KEY}, raw[KEY]


def model_context(env, params, group: str) -> ModelContext:
    spec = env.spec
    g = spec.group(group)
    sellers = spec.sellers
    low = np.concatenate([np.asarray(params.sellers[s.name].low) for s in sellers])
    high = np.concatenate([np.asarray(params.sellers[s.name].high) for s in sellers])
    queries = sum(np.asarray(params.consumers[c.name].queries, np.float64).sum(0)
                  for c in spec.consumers)
    return ModelContext(group=group, side=g.side, num_agents=g.count,
                        obs_dim=int(env.observation_shape(group, params)[-1]),
                        num_products=spec.num_products,
                        group_offset=g.offset if g.side == "seller" else -1,
                        seller_groups=tuple((s.name, s.count) for s in sellers),
                        seller_low=low.astype(np.float32), seller_high=high.astype(np.float32),
                        queries=np.asarray(queries, np.float32))


def build_model(env, params, group: str, cfg: ModelConfig):
    """The group's :class:`~jaxmarket.models.base.ExternalModel`."""
    return MODELS[cfg.kind].make(cfg.model_settings, model_context(env, params, group))


def resolve_model(env, params, group: str, raw: Any, populations: Any = None) -> ModelConfig:
    where = f"learners.{group}.{KEY}"
    kind, d = lookup_kind(raw, MODELS, where, "a mapping with a 'kind' key, e.g. {kind: demand}")
    fields = {**d.fields, **EVAL_FIELDS}
    vals = check_mapping(fields, raw, where)
    pop = (populations or {}).get(group)
    if pop is not None and pop.league:
        raise ConfigError(f"{where}", raw, "no external model on a group with a league "
                          "mapping (its snapshot seats are not the learner's experience)")
    settings = {k: vals[k] for k in d.fields}
    poi = None
    if vals["poi"] is not None:
        pw = f"{where}.poi"
        pkind, pdef = lookup_kind(vals["poi"], POI_FIELDS, pw,
                                  "a mapping with a 'kind' key, e.g. {kind: disagreement}")
        pvals = check_mapping({**POI_COMMON, **pdef.fields}, vals["poi"], pw)
        if pdef.needs_spread and settings.get("ensemble", 1) < 2 and settings.get("dropout", 0) == 0:
            raise ConfigError(f"{pw}.kind", pkind, "a POI that needs no spread (zero, gradient, "
                              f"error), or a model with ensemble >= 2 or dropout > 0 "
                              f"({pkind} measures the members' disagreement)")
        if pvals["target"] == "state" and pdef.needs_target:
            raise ConfigError(f"{pw}.target", "state", f"action ({pkind} needs the targets "
                              "of the input, and the state reached reveals them only at the "
                              "next step), or a POI without targets (zero, disagreement)")
        poi = tuple(sorted({"kind": pkind, **pvals}.items()))
    poi_obs = None
    if vals["poi_obs"] is not None:
        ow = f"{where}.poi_obs"
        ovals = check_mapping(POI_OBS_FIELDS, vals["poi_obs"], ow, ignore=())
        if poi is None:
            raise ConfigError(ow, vals["poi_obs"], "a poi block beside it (its kind is the "
                              "field poi_obs evaluates; beta: 0 for no bonus)")
        if ovals["sampler"] != "replay" and POI_FIELDS[dict(poi)["kind"]].needs_target:
            raise ConfigError(f"{ow}.sampler", ovals["sampler"],
                              f"replay ({dict(poi)['kind']} needs targets, known only at "
                              "replayed inputs), or a POI without targets (zero, disagreement)")
        poi_obs = tuple(sorted(ovals.items()))
    cfg = ModelConfig(kind, tuple(sorted((k, _hashable(v)) for k, v in settings.items())),
                      vals["eval_every"], vals["eval_grid"], vals["eval_random"], poi, poi_obs)
    model = build_model(env, params, group, cfg)
    check_io(env, params, group, model, where)
    needs_inputs = (poi is not None and dict(poi)["target"] == "state") or poi_obs is not None
    if needs_inputs and model.make_inputs is None:
        field = f"{where}.poi.target" if poi_obs is None else f"{where}.poi_obs"
        raise ConfigError(field, kind, "a model with make_inputs (the inputs of a state): "
                          "demand, reward or rival")
    if poi_obs is not None and ovals["sampler"] != "replay" and model.own_dims < 1:
        raise ConfigError(f"{where}.poi_obs.sampler", ovals["sampler"],
                          "replay (the model declares no own-price inputs, own_dims = 0)")
    return cfg


def poi_obs_block(learner_config: Any, where: str) -> dict | None:
    """The validated ``external_model.poi_obs`` settings of a group's learner config
    (``where``: ``learners.<group>``), or None. A learner that reads no observation
    features is refused here: the POI values would go nowhere."""
    _, block = split_model(learner_config)
    if not isinstance(block, Mapping) or block.get("poi_obs") is None:
        return None
    ow = f"{where}.{KEY}.poi_obs"
    vals = check_mapping(POI_OBS_FIELDS, block["poi_obs"], ow, ignore=())
    kind = learner_config.get("kind") if isinstance(learner_config, Mapping) else None
    if kind not in POI_OBS_LEARNERS:
        raise ConfigError(ow, dict(block["poi_obs"]), "no poi_obs on a learner without "
                          f"observation features (kind: {kind}); a learner of kind "
                          + " or ".join(POI_OBS_LEARNERS))
    return vals


def poi_obs_spec(learner_config: Any, spec: Any, where: str) -> Any:
    """With ``external_model.poi_obs`` the learner sees ``k`` more observation features,
    the POI values the training loop appends; with ``emb_size > 0`` its policy embeds
    them (``spec.obs_embed = (k, emb_size)``)."""
    block = poi_obs_block(learner_config, where)
    if block is None:
        return spec
    k, size = block["k"], block["emb_size"]
    return dataclasses.replace(spec, obs_dim=spec.obs_dim + k,
                               obs_embed=(k, size) if size > 0 else None)


def check_io(env, params, group: str, model, where: str) -> None:
    """``make_io`` on one traced market step must give ``[E, A, in_dim]`` inputs and
    ``[E, A, out_dim]`` targets (a custom model whose declared sizes do not match its
    ``make_io`` fails here, before compiling)."""
    def one_step():
        obs, state = env.reset_env(jax.random.key(0), params)
        acts = current_actions(env.spec, state)
        obs2, _, rewards, _, info = env.step_env(jax.random.key(0), state, acts, params)
        tr = Transition(obs=obs[group], action=acts[group], reward=rewards[group],
                        next_obs=obs2[group], done=jnp.zeros(rewards[group].shape, bool),
                        aux={})
        info = {**info, "prev_prices": info["prices"]}   # the profile held
        batch = jax.tree.map(lambda v: v[None], (tr, info))
        return model.make_io(*batch)

    try:
        x, y = jax.eval_shape(one_step)
    except (TypeError, ValueError, KeyError, IndexError) as err:
        raise ConfigError(where, model, f"a model whose make_io runs on the market's step "
                          f"({type(err).__name__}: {str(err).splitlines()[0][:80]})") from None
    A = env.num_agents(group)
    want_x, want_y = (1, A, model.in_dim), (1, A, model.out_dim)
    if tuple(x.shape) != want_x or tuple(y.shape) != want_y:
        raise ConfigError(where, f"make_io -> inputs {list(x.shape)}, targets {list(y.shape)}",
                          f"inputs {list(want_x)} and targets {list(want_y)} "
                          "(the model's in_dim and out_dim)")


def resolve_group_models(env, params, learners: Any, populations: Mapping) -> dict:
    """``{group: ModelConfig}`` for the groups whose learner config has an
    ``external_model`` (``populations``: the plan's, to refuse league groups)."""
    if not isinstance(learners, Mapping):
        return {}
    out = {}
    for g, raw in learners.items():
        block = split_model(raw)[1]
        if block is not None:
            out[g] = resolve_model(env, params, g, block, {g: populations.get(g)})
    return out


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v
