"""Model surgery (OpenAI Five, Berner et al. 2019, appendix B): change a trained policy's shape and keep its function.

Every transformation is a pure function from a policy's parameters (a ``state_dict``: parameters and buffers, by
name) to the parameters of the changed policy, which computes what the old one computed:

- ``widen_embed`` (model.embed_size) and ``widen_core`` on the feed-forward core (model.lstm_size, core=mlp) are
  exact (Net2Net): a layer's new units get random incoming weights and zero outgoing weights, so that every layer
  downstream ignores them until training moves those weights. Where a dot product is divided by √d (attention
  pooling, the target head), the query's old entries are scaled by √(d_new / d_old) so the scores stay the same.
- ``widen_core`` on the LSTM is approximate, as in OpenAI Five: every new LSTM weight, and the heads' weights from
  the new units, is drawn at ``scale`` (default 1e-3) times the usual initialisation. Zero would keep the new units
  identical to one another forever; the usual scale changes the policy.
- ``add_feature`` (a new attribute of a unit type, or a new global feature) is exact: the feature's input weights are
  zero, and its normalisation statistics are neutral (mean 0, variance 1 with the other features' count).
- ``remove_feature`` is exact where the removed feature held the constant it is removed at: its weights' contribution
  at that constant is folded into the layer's bias, as if the environment kept sending the constant.
- ``add_action`` (a new primary action) leaves the old actions' logits as they are and gives the new one an old
  action's logit plus an offset (a copy of its weights, its bias + offset) derived from a tolerance τ: the largest
  probability the new action may take from the old ones, which is also the total-variation distance between the old
  and the new policy's action distributions (``new_action_offset``). Approximate within τ where the new action is
  legal, exact where it is not. τ trades closeness against learning: PPO's gradient on the new logit is proportional
  to its probability: started at −20 (τ ≈ 2e-9), heal was never tried; at 1e-3 it was learned (docs/surgery.md).

``carry_optimizer`` and ``carry_clip`` then keep Adam's moments and OpenAI Five's clip statistics of every
parameter whose shape did not change and reset the others, which ``PPOConfig.lr_zero_until`` lets re-form before
the learning rate moves anything. ``jobs/surgery.py`` applies them to a run's checkpoint; docs/surgery.md.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from hpc_rl.envs.api import EnvSpec
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import Policy, norm_keys

Params = dict[str, torch.Tensor]
LSTM_SCALE = 1e-3  # new LSTM weights, relative to the usual initialisation
NEW_ACTION_TOLERANCE = 1e-3  # the largest probability a new action may take from the old ones (new_action_offset)
NORM_CLIP = 5.0  # hpc_rl.algo.normalizer.normalize's default, which the policy applies


def _uniform(shape: tuple[int, ...], bound: float, generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """U(−bound, bound), PyTorch's initialisation of a Linear or LSTM layer for bound 1/√fan_in (or 1/√hidden)."""
    return ((torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * bound).to(like.dtype)


def _normal(shape: tuple[int, ...], std: float, generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    return (torch.randn(shape, generator=generator, dtype=torch.float64) * std).to(like.dtype)


def _zeros(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    return torch.zeros(shape, dtype=like.dtype)


def _add_outputs(params: Params, name: str, extra: int, generator: torch.Generator, scale: float = 1.0) -> None:
    """Linear layer ``name``: ``extra`` new output units with freshly initialised weights and bias (× ``scale``)."""
    weight, bias = params[f"{name}.weight"], params[f"{name}.bias"]
    bound = scale / math.sqrt(weight.shape[1])
    params[f"{name}.weight"] = torch.cat([weight, _uniform((extra, weight.shape[1]), bound, generator, weight)])
    params[f"{name}.bias"] = torch.cat([bias, _uniform((extra,), bound, generator, bias)])


def _add_inputs(weight: torch.Tensor, groups: int, extra: int, fill=None) -> torch.Tensor:
    """A (out, groups·d) weight whose input is ``groups`` concatenated d-wide parts, each part widened by ``extra``
    columns after its own: zero (exact), or ``fill(shape)``."""
    out, width = weight.shape
    d = width // groups
    parts = []
    for k in range(groups):
        parts.append(weight[:, k * d:(k + 1) * d])
        parts.append(_zeros((out, extra), weight) if fill is None else fill((out, extra)))
    return torch.cat(parts, dim=1)


def _grow_columns(table: torch.Tensor, extra: int, values: torch.Tensor) -> torch.Tensor:
    return torch.cat([table, values.to(table.dtype).reshape(table.shape[0], extra)], dim=1)


def _growth(name: str, old: int, new: int) -> int:
    """The units a widening of ``name`` from ``old`` to ``new`` adds; a shrinking is refused."""
    if new < old:
        raise ValueError(f"{name} {old} -> {new}: surgery widens layers, it does not shrink them")
    return new - old


def widen_embed(params: Params, spec: EnvSpec, size: int, generator: torch.Generator) -> Params:
    """model.embed_size d → ``size``: the global encoder, hero, type and action embeddings and every entity
    encoder get new units; the core's input layer, the pooling queries and the target query ignore them. Exact."""
    d = params["hero_embed.weight"].shape[1]
    extra = _growth("embed_size", d, size)
    params = dict(params)
    if extra == 0:
        return params
    if spec.global_features:
        _add_outputs(params, "global_net.0", extra, generator)
    hero = params["hero_embed.weight"]
    params["hero_embed.weight"] = _grow_columns(hero, extra, _normal((hero.shape[0], extra), 1.0, generator, hero))
    for i in range(len(spec.entities)):
        second = f"entity_nets.{i}.2"
        _add_outputs(params, f"entity_nets.{i}.0", extra, generator)
        params[f"{second}.weight"] = _add_inputs(params[f"{second}.weight"], 1, extra)
        _add_outputs(params, second, extra, generator)
    root = math.sqrt(size / d)  # scores divide by √d: the old entries of a query grow by this
    if spec.entities:
        types = params["type_embed"]
        params["type_embed"] = _grow_columns(types, extra, _normal((types.shape[0], extra), 0.1, generator, types))
    if "pool_query" in params:
        query = params["pool_query"]
        params["pool_query"] = _grow_columns(query * root, extra, _zeros((query.shape[0], extra), query))
    groups = (1 if spec.global_features else 0) + len(spec.entities) + 1  # global, a pooled part per type, hero
    params["core_in.0.weight"] = _add_inputs(params["core_in.0.weight"], groups, extra)
    if "target_query.weight" in params:
        weight, bias = params["target_query.weight"], params["target_query.bias"]
        params["target_query.weight"] = torch.cat([weight * root, _zeros((extra, weight.shape[1]), weight)])
        params["target_query.bias"] = torch.cat([bias * root, _zeros((extra,), bias)])
        embed = params["action_embed.weight"]
        params["action_embed.weight"] = _grow_columns(embed, extra,
                                                      _normal((embed.shape[0], extra), 1.0, generator, embed))
    return params


HEAD_LAYERS = ("action_head", "move_head", "target_query", "value_head")  # the layers reading the core's output


def widen_core(params: Params, config: ModelConfig, size: int, generator: torch.Generator,
               scale: float = LSTM_SCALE) -> Params:
    """model.lstm_size H → ``size``, the core's hidden size. Feed-forward core: exact (new units' outgoing weights
    zero). LSTM: every new weight at ``scale`` × PyTorch's initialisation U(±1/√H), the heads' weights from the new
    units too; the input layer's new units feed only those small weights."""
    hidden = params["core_in.0.weight"].shape[0]
    extra = _growth("lstm_size", hidden, size)
    params = dict(params)
    if extra == 0:
        return params
    _add_outputs(params, "core_in.0", extra, generator)
    small = None
    if config.core == "mlp":
        params["mlp.0.weight"] = _add_inputs(params["mlp.0.weight"], 1, extra)
        _add_outputs(params, "mlp.0", extra, generator)
    else:
        bound = scale / math.sqrt(size)
        small = lambda shape: _uniform(shape, bound, generator, params["core_in.0.weight"])  # noqa: E731
        for kind in ("ih", "hh"):
            # PyTorch stacks the gates (input, forget, cell, output) as four H-row blocks: each grows by ``extra``
            # rows, and every row by ``extra`` columns (the new inputs or the new hidden units).
            weight = _add_inputs(params[f"lstm.weight_{kind}_l0"], 1, extra, small)
            bias = params[f"lstm.bias_{kind}_l0"]
            blocks_w, blocks_b = [], []
            for gate in range(4):
                blocks_w += [weight[gate * hidden:(gate + 1) * hidden], small((extra, size))]
                blocks_b += [bias[gate * hidden:(gate + 1) * hidden], small((extra,))]
            params[f"lstm.weight_{kind}_l0"] = torch.cat(blocks_w)
            params[f"lstm.bias_{kind}_l0"] = torch.cat(blocks_b)
    for head in HEAD_LAYERS:
        if f"{head}.weight" in params:
            params[f"{head}.weight"] = _add_inputs(params[f"{head}.weight"], 1, extra, small)
    return params


def input_layer(spec: EnvSpec, key: str) -> str:
    """The Linear layer that reads observation ``key`` ("global" or "entities/<type>")."""
    if key == "global":
        return "global_net.0"
    names = [f"entities/{e.name}" for e in spec.entities]
    if key not in names:
        raise ValueError(f"no observation {key!r}; the spec has {norm_keys(spec)}")
    return f"entity_nets.{names.index(key)}.0"


def _check_key(spec: EnvSpec, key: str) -> int:
    keys = norm_keys(spec)
    if key not in keys:
        raise ValueError(f"no observation {key!r}; the spec has {keys}")
    return keys.index(key)


def add_feature(params: Params, spec: EnvSpec, key: str, position: int | None = None,
                normalizers: dict | None = None) -> tuple[Params, dict | None]:
    """A new feature of observation ``key`` at ``position`` (default: last): zero input weights, normalised with mean
    0 and std 1. ``normalizers`` (the learner's statistics by key: count, mean, m2) get mean 0 and variance 1 over the
    key's count; the running statistics then move towards the feature's own at the rate of any new sample. Exact."""
    i = _check_key(spec, key)
    layer = input_layer(spec, key)
    params = dict(params)
    weight = params[f"{layer}.weight"]
    j = weight.shape[1] if position is None else position
    if not 0 <= j <= weight.shape[1]:
        raise ValueError(f"position {j} is outside 0..{weight.shape[1]} for {key!r}")
    params[f"{layer}.weight"] = torch.cat([weight[:, :j], _zeros((weight.shape[0], 1), weight), weight[:, j:]], dim=1)
    for buffer, neutral in ((f"obs_mean_{i}", 0.0), (f"obs_std_{i}", 1.0)):
        old = params[buffer]
        params[buffer] = torch.cat([old[:j], torch.full((1,), neutral, dtype=old.dtype), old[j:]])
    if normalizers is not None:
        stats = normalizers[key]
        normalizers = {**normalizers, key: {"count": stats["count"],
                                            "mean": np.insert(np.asarray(stats["mean"]), j, 0.0),
                                            "m2": np.insert(np.asarray(stats["m2"]), j, float(stats["count"]))}}
    return params, normalizers


def remove_feature(params: Params, spec: EnvSpec, key: str, position: int, constant: float,
                   normalizers: dict | None = None) -> tuple[Params, dict | None]:
    """Feature ``position`` of observation ``key`` leaves the network: what its weights added when it held
    ``constant`` (raw, before normalisation) is folded into the layer's bias. Exact on observations where it held
    ``constant``."""
    i = _check_key(spec, key)
    layer = input_layer(spec, key)
    params = dict(params)
    weight = params[f"{layer}.weight"]
    if not 0 <= position < weight.shape[1]:
        raise ValueError(f"position {position} is outside 0..{weight.shape[1] - 1} for {key!r}")
    mean, std = params[f"obs_mean_{i}"][position], params[f"obs_std_{i}"][position]
    z = torch.clamp((torch.as_tensor(constant, dtype=mean.dtype) - mean) / std, -NORM_CLIP, NORM_CLIP)
    params[f"{layer}.bias"] = params[f"{layer}.bias"] + weight[:, position] * z
    keep = [c for c in range(weight.shape[1]) if c != position]
    params[f"{layer}.weight"] = weight[:, keep]
    for buffer in (f"obs_mean_{i}", f"obs_std_{i}"):
        params[buffer] = params[buffer][keep]
    if normalizers is not None:
        stats = normalizers[key]
        normalizers = {**normalizers, key: {"count": stats["count"],
                                            "mean": np.delete(np.asarray(stats["mean"]), position),
                                            "m2": np.delete(np.asarray(stats["m2"]), position)}}
    return params, normalizers


def new_action_offset(tolerance: float) -> float:
    """The offset o of a new action's logit from the action ``like`` it copies that lets it take at most
    ``tolerance`` (τ) of probability from the old actions, on every observation where it is legal.

    With the old actions' softmax normaliser Z and q = ``like``'s old probability, the new action's probability is
    p = q·e^o / (1 + q·e^o), rising with q, so at most σ(o) = e^o / (1 + e^o) (reached where the policy is sure of
    ``like``). Every old action's probability is scaled by 1 − p: the mass the old actions lose, and the total
    variation between the old and the new distribution, is p; every old log-probability changes by log(1 − p),
    at most −log(1 − τ) ≈ τ. So o = logit(τ) = log(τ / (1 − τ)): the largest offset within τ."""
    if not 0.0 < tolerance < 1.0:
        raise ValueError(f"a new action's tolerance is a probability in (0, 1), got {tolerance}")
    return math.log(tolerance) - math.log1p(-tolerance)


def add_action(params: Params, uses_move: bool, uses_target: bool, generator: torch.Generator, like: int = 0,
               tolerance: float = NEW_ACTION_TOLERANCE) -> Params:
    """A new primary action, last: its logit is action ``like``'s plus ``new_action_offset(tolerance)`` on every
    observation (a copy of that action's weights, its bias + the offset), so it takes at most ``tolerance`` of
    probability from the old actions; its embedding (which gates the target head) is random. ``uses_move``/
    ``uses_target``: the heads it uses."""
    offset = new_action_offset(tolerance)
    params = dict(params)
    weight, bias = params["action_head.weight"], params["action_head.bias"]
    if not 0 <= like < weight.shape[0]:
        raise ValueError(f"like={like}: the policy has actions 0..{weight.shape[0] - 1}")
    params["action_head.weight"] = torch.cat([weight, weight[like:like + 1]])
    params["action_head.bias"] = torch.cat([bias, bias[like:like + 1] + offset])
    if "action_embed.weight" in params:
        embed = params["action_embed.weight"]
        params["action_embed.weight"] = torch.cat([embed, _normal((1, embed.shape[1]), 1.0, generator, embed)])
    for buffer, flag in (("uses_move", uses_move), ("uses_target", uses_target)):
        params[buffer] = torch.cat([params[buffer], torch.tensor([flag])])
    return params


def spec_with_feature(spec: EnvSpec, key: str, delta: int) -> EnvSpec:
    """``spec`` with observation ``key`` wider by ``delta`` features (the spec ``add_feature``/``remove_feature``
    produce a policy for)."""
    if key == "global":
        return replace(spec, global_features=spec.global_features + delta)
    entities = tuple(replace(e, num_features=e.num_features + delta) if f"entities/{e.name}" == key else e
                     for e in spec.entities)
    return replace(spec, entities=entities)


def spec_with_action(spec: EnvSpec, uses_move: bool, uses_target: bool) -> EnvSpec:
    return replace(spec, num_actions=spec.num_actions + 1,
                   action_uses_move=tuple(spec.action_uses_move) + (uses_move,),
                   action_uses_target=tuple(spec.action_uses_target) + (uses_target,))


# --- the learner's state --------------------------------------------------------------------------------------------
def parameter_names(spec: EnvSpec, config: ModelConfig) -> list[str]:
    """The trainable parameters in the order the optimiser and the clip index them (``Policy.parameters()``)."""
    return [name for name, _ in Policy(spec, config).named_parameters()]


def carry_optimizer(state: dict, names: list[str], old: Params, new: Params) -> dict:
    """Adam's state (``optimizer.state_dict()``, as a tree of arrays or tensors) for the new parameters: a parameter
    whose shape is unchanged keeps its moments and step count; a changed one has none, so Adam starts it afresh (with
    its own bias correction) at its next step. ``names``: the parameters in index order, the same before and after."""
    kept = {}
    for index, moments in state["state"].items():
        name = names[int(index)]
        if tuple(old[name].shape) == tuple(new[name].shape):
            kept[index] = moments
    return {**state, "state": kept}


def carry_clip(state: dict, names: list[str], old: Params, new: Params) -> dict:
    """OpenAI Five's clip state (``SecondMomentClip.state_dict()``: a step count and one flat v in parameter order)
    for the new parameters: v of every unchanged parameter kept, of every changed one zero. The step count (one for
    every parameter) goes on, so a reset v starts small and clips hard until it re-forms: lr_zero_until's versions."""
    v = torch.as_tensor(np.asarray(state["v"]))
    parts, offset = [], 0
    for name in names:
        size = old[name].numel()
        same = tuple(old[name].shape) == tuple(new[name].shape)
        parts.append(v[offset:offset + size] if same else torch.zeros(new[name].numel(), dtype=v.dtype))
        offset += size
    if offset != v.numel():
        raise ValueError(f"clip state holds {v.numel()} entries, the parameters {offset}")
    return {**state, "v": torch.cat(parts).numpy()}


# --- comparing policies ---------------------------------------------------------------------------------------------
@torch.no_grad()
def head_outputs(policy: Policy, obs: dict[str, torch.Tensor], hero: torch.Tensor,
                 starts: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the policy computes on (L, N) steps played from a zero state: every head's log-probabilities (masked as
    the policy samples from them; the target head's for every primary action) and the value. What surgery keeps."""
    steps, n = starts.shape
    m = steps * n
    h, units, _ = policy.core(obs, hero, starts, policy.initial_state(n, starts.device), need_state=False)
    mask = lambda name: obs[name].reshape(m, -1)  # noqa: E731
    out = {"action": torch.log_softmax(policy.action_head(h).masked_fill(~mask("action_mask"), -torch.inf), -1)}
    if policy.move_head is not None:
        out["move"] = torch.log_softmax(policy.move_head(h).masked_fill(~mask("move_mask"), -torch.inf), -1)
    if policy.target_query is not None:
        targets = mask("target_mask")
        for a in range(policy.spec.num_actions):
            action = torch.full((m,), a, dtype=torch.long, device=h.device)
            scores = policy.target_scores(h, units, action).masked_fill(~targets, -torch.inf)
            out[f"target/{a}"] = torch.log_softmax(scores, -1)
    out["value"] = policy.value_head(h).squeeze(-1) * policy.value_std + policy.value_mean
    return out


def max_abs_diff(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """The largest |before − after| over every output ``before`` has, on the entries where it is finite (a legal
    choice) and over the choices it has (a policy with a new action is compared on the old ones; the new action's
    target head is not compared). NaN if an output changed which entries are legal."""
    worst = 0.0
    for key, old in before.items():
        new = after[key][..., :old.shape[-1]] if key == "action" else after[key]
        finite = torch.isfinite(old)
        if not torch.equal(finite, torch.isfinite(new)):
            return math.nan
        if finite.any():
            worst = max(worst, float((old[finite].double() - new[finite].double()).abs().max()))
    return worst
