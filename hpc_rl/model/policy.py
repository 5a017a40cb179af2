"""The policy: entity encoders + global features → one core (LSTM or feed-forward) → decoupled, masked heads and a value.

Inputs follow ``hpc_rl.envs.api`` (observation keys ``global``, ``entities/<type>`` and their masks, the action,
move and target masks) plus a hero index, since one network controls every hero of a team (OpenAI Five). What the
spec lacks is absent: with no entities there is no entity encoder and no target head; with one move offset there
is no move head. A flat Gymnasium observation is thus ``global`` → core → action head and value.

- Entity encoder (Neural MMO, Honor of Kings): each unit type has its own MLP and type embedding; the units of a
  type are pooled by attention of a learned query, or by max-pooling, over the slots its mask marks present.
- Target head (OpenAI Five appendix H, Honor of Kings eq. 1): softmax over units of q · (u ∘ σ(e_a)), q a linear map
  of the LSTM output, u a unit embedding, e_a the embedding of the chosen primary action: the action gates which
  unit features matter.
- Heads are decoupled (Honor of Kings eq. 3): the action's log-probability is the sum of the heads the chosen
  primary action uses (``spec.action_uses_move`` / ``action_uses_target``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hpc_rl.algo.bptt import LSTMState, unroll_lstm
from hpc_rl.algo.normalizer import normalize
from hpc_rl.envs.api import EnvSpec
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.heads import masked_entropy, masked_log_softmax, sample

HEADS = ("action", "move", "target")


@dataclass
class PolicyStep:
    """What the policy computed for (L, N) steps; ``actions`` holds every head (zeros for heads the spec lacks)."""

    actions: dict[str, torch.Tensor]
    logp: torch.Tensor  # sum of the used heads' log-probabilities
    entropy: torch.Tensor  # sum of the used heads' entropies
    value: torch.Tensor
    state: LSTMState | None
    teacher_logp: torch.Tensor | None = None  # log π of the teacher's actions, where the learner asked for them


def hero_indices(spec: EnvSpec) -> np.ndarray:
    """The hero index of every agent slot: its position among the agents of its team (0, 1, ... per team)."""
    seen: dict[int, int] = {}
    index = np.zeros(spec.num_agents, dtype=np.int64)
    for agent, team in enumerate(spec.agent_team):
        index[agent] = seen.get(team, 0)
        seen[team] = index[agent] + 1
    return index


def norm_keys(spec: EnvSpec) -> list[str]:
    """The normalised observation keys; the i-th one's statistics are the buffers ``obs_mean_<i>``, ``obs_std_<i>``."""
    return (["global"] if spec.global_features else []) + [f"entities/{e.name}" for e in spec.entities]


class Policy(nn.Module):
    def __init__(self, spec: EnvSpec, config: ModelConfig | None = None):
        super().__init__()
        config = config or ModelConfig()
        self.spec = spec
        self.config = config
        d, hidden = config.embed_size, config.lstm_size
        self.has_move = spec.num_moves > 1 and any(spec.action_uses_move)
        self.has_target = spec.num_targets > 0 and any(spec.action_uses_target)

        # Observation normalisation ships inside the parameters (buffers), so actors and learners agree on it.
        self.norm_keys = norm_keys(spec)
        widths = ([spec.global_features] if spec.global_features else []) + [e.num_features for e in spec.entities]
        for i, width in enumerate(widths):
            self.register_buffer(f"obs_mean_{i}", torch.zeros(width))
            self.register_buffer(f"obs_std_{i}", torch.ones(width))

        self.global_net = nn.Sequential(nn.Linear(spec.global_features, d), nn.ReLU()) if spec.global_features else None
        self.hero_embed = nn.Embedding(int(hero_indices(spec).max()) + 1, d)
        self.entity_nets = nn.ModuleList(
            nn.Sequential(nn.Linear(e.num_features, d), nn.ReLU(), nn.Linear(d, d)) for e in spec.entities)
        types = len(spec.entities)
        self.type_embed = nn.Parameter(torch.randn(types, d) * 0.1) if types else None
        attention = types and config.entity_pooling == "attention"
        self.pool_query = nn.Parameter(torch.randn(types, d) * 0.1) if attention else None
        inputs = d * (2 + len(spec.entities)) if spec.global_features else d * (1 + len(spec.entities))
        self.core_in = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU())
        # The feed-forward core keeps the recurrent interface (a state in, the same state out) so that actors, segments
        # and the learner handle both cores alike; its state stays zero.
        self.lstm = nn.LSTM(hidden, hidden) if config.core == "lstm" else None
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()) if config.core == "mlp" else None

        self.action_head = nn.Linear(hidden, spec.num_actions)
        self.move_head = nn.Linear(hidden, spec.num_moves) if self.has_move else None
        self.target_query = nn.Linear(hidden, d) if self.has_target else None
        self.action_embed = nn.Embedding(spec.num_actions, d) if self.has_target else None
        self.value_head = nn.Linear(hidden, 1)
        # The value head predicts the return standardised by these statistics (the learner's running statistics of the
        # returns when ``ppo.value_norm``; 0 and 1 otherwise); ``forward`` reports it in reward units.
        self.register_buffer("value_mean", torch.zeros(()))
        self.register_buffer("value_std", torch.ones(()))
        uses_move = spec.action_uses_move or (False,) * spec.num_actions
        uses_target = spec.action_uses_target or (False,) * spec.num_actions
        self.register_buffer("uses_move", torch.tensor(uses_move, dtype=torch.bool))
        self.register_buffer("uses_target", torch.tensor(uses_target, dtype=torch.bool))
        # Small initial policy logits: near-uniform first actions (Andrychowicz et al. 2021).
        nn.init.orthogonal_(self.action_head.weight, 0.01)
        nn.init.zeros_(self.action_head.bias)
        nn.init.orthogonal_(self.value_head.weight, 1.0)
        nn.init.zeros_(self.value_head.bias)

    def initial_state(self, n: int, device: torch.device | str = "cpu") -> LSTMState:
        zeros = torch.zeros(n, self.config.lstm_size, device=device)
        return zeros, zeros.clone()

    def set_normalizer(self, key: str, mean: torch.Tensor, std: torch.Tensor) -> None:
        i = self.norm_keys.index(key)
        getattr(self, f"obs_mean_{i}").copy_(torch.as_tensor(mean))
        getattr(self, f"obs_std_{i}").copy_(torch.as_tensor(std))

    def set_value_normalizer(self, mean: float, std: float) -> None:
        self.value_mean.fill_(mean)
        self.value_std.fill_(std)

    def normalized_value(self, value: torch.Tensor) -> torch.Tensor:
        """A value (or return) in reward units, in the units the value head predicts."""
        return (value - self.value_mean) / self.value_std

    def _normalized(self, key: str, x: torch.Tensor) -> torch.Tensor:
        i = self.norm_keys.index(key)
        return normalize(x, getattr(self, f"obs_mean_{i}"), getattr(self, f"obs_std_{i}"))

    def _pool(self, i: int, units: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Pool (M, slots, d) unit embeddings over present slots to (M, d); no unit present gives zeros."""
        present = mask.any(dim=-1, keepdim=True)
        if self.config.entity_pooling == "max":
            pooled = units.masked_fill(~mask.unsqueeze(-1), float("-inf")).max(dim=1).values
            return torch.where(present, pooled, torch.zeros_like(pooled))
        scores = units @ self.pool_query[i] / math.sqrt(units.shape[-1])
        logp, _, _ = masked_log_softmax(scores, mask)
        return (logp.exp().unsqueeze(-1) * units).sum(dim=1) * present

    def core(self, obs: dict[str, torch.Tensor], hero: torch.Tensor, starts: torch.Tensor, state: LSTMState,
             need_state: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, LSTMState | None]:
        """LSTM output (L·N, H), unit embeddings (L·N, num_targets, d) or None, and the state after the last step
        (None if not ``need_state`` and a game starts inside the steps: see ``unroll_lstm``)."""
        steps, n = starts.shape
        m = steps * n
        parts = []
        if self.global_net is not None:
            parts.append(self.global_net(self._normalized("global", obs["global"].reshape(m, -1))))
        units = []
        for i, e in enumerate(self.spec.entities):
            key = f"entities/{e.name}"
            x = self._normalized(key, obs[key].reshape(m, e.max_count, e.num_features))
            u = self.entity_nets[i](x) + self.type_embed[i]
            units.append(u)
            parts.append(self._pool(i, u, obs[f"{key}/mask"].reshape(m, e.max_count)))
        parts.append(self.hero_embed(hero.reshape(m)))
        z = self.core_in(torch.cat(parts, dim=-1)).reshape(steps, n, -1)
        if self.lstm is not None:
            h, state = unroll_lstm(self.lstm, z, starts, state, need_state)
        else:
            h = self.mlp(z)
            state = state if need_state else None
        return h.reshape(m, -1), (torch.cat(units, dim=1) if units else None), state

    def forward(self, obs: dict[str, torch.Tensor], hero: torch.Tensor, starts: torch.Tensor, state: LSTMState,
                actions: dict[str, torch.Tensor] | None = None, deterministic: bool = False,
                teacher: dict[str, torch.Tensor] | None = None) -> PolicyStep:
        """Act (``actions=None``: sample, or argmax if ``deterministic``) or score the given ``actions``; with
        ``teacher`` (actions of every head, like ``actions``) also score those (``PolicyStep.teacher_logp``).

        Every tensor has leading dimensions (L, N): L steps of N independent agents, starting from ``state``. When
        scoring given actions (the learner) the state after the last step is not computed (``state`` is None).
        """
        steps, n = starts.shape
        m = steps * n
        h, units, new_state = self.core(obs, hero, starts, state, need_state=actions is None)
        given = None if actions is None else {k: v.reshape(m) for k, v in actions.items()}
        chosen, logp, entropy = self._heads(h, units, obs, given, deterministic)
        teacher_logp = None
        if teacher is not None:
            _, teacher_logp, _ = self._heads(h, units, obs, {k: v.reshape(m) for k, v in teacher.items()}, False)
            teacher_logp = teacher_logp.reshape(steps, n)
        value = self.value_head(h).squeeze(-1) * self.value_std + self.value_mean
        shape = (steps, n)
        return PolicyStep({k: v.reshape(shape) for k, v in chosen.items()}, logp.reshape(shape),
                          entropy.reshape(shape), value.reshape(shape), new_state, teacher_logp)

    def target_scores(self, h: torch.Tensor, units: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The target head's logits (M, num_targets) on core outputs ``h`` (M, H) for primary actions ``action``."""
        gated_query = self.target_query(h) * torch.sigmoid(self.action_embed(action))
        return torch.einsum("mud,md->mu", units, gated_query) / math.sqrt(units.shape[-1])

    def _heads(self, h: torch.Tensor, units: torch.Tensor | None, obs: dict[str, torch.Tensor],
               given: dict[str, torch.Tensor] | None, deterministic: bool
               ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """The decoupled action on core outputs ``h`` (M, H): every head's choice (sampled, or ``given``), the summed
        log-probability and entropy of the heads the primary action uses."""
        m = h.shape[0]
        logp_a, applied, _ = masked_log_softmax(self.action_head(h), obs["action_mask"].reshape(m, -1))
        action = sample(logp_a, deterministic) if given is None else given["action"]
        logp = logp_a.gather(1, action.unsqueeze(1)).squeeze(1)
        entropy = masked_entropy(logp_a, applied)
        chosen = {"action": action}

        if self.move_head is not None:
            lp, applied, usable = masked_log_softmax(self.move_head(h), obs["move_mask"].reshape(m, -1))
            chosen["move"] = sample(lp, deterministic) if given is None else given["move"]
            used = self.uses_move[action] & usable
            logp = logp + torch.where(used, lp.gather(1, chosen["move"].unsqueeze(1)).squeeze(1), 0.0)
            entropy = entropy + torch.where(used, masked_entropy(lp, applied), 0.0)
        if self.target_query is not None:
            lp, applied, usable = masked_log_softmax(self.target_scores(h, units, action),
                                                     obs["target_mask"].reshape(m, -1))
            chosen["target"] = sample(lp, deterministic) if given is None else given["target"]
            used = self.uses_target[action] & usable
            logp = logp + torch.where(used, lp.gather(1, chosen["target"].unsqueeze(1)).squeeze(1), 0.0)
            entropy = entropy + torch.where(used, masked_entropy(lp, applied), 0.0)
        for head in HEADS:
            chosen.setdefault(head, torch.zeros_like(action))
        return chosen, logp, entropy


@torch.no_grad()
def act(policy: Policy, obs: dict[str, torch.Tensor], hero: torch.Tensor, starts: torch.Tensor, state: LSTMState,
        deterministic: bool = False) -> PolicyStep:
    """One policy step for N agents: ``obs`` etc. lead with (N,), the result's fields with (N,)."""
    step = policy({k: v.unsqueeze(0) for k, v in obs.items()}, hero.unsqueeze(0), starts.unsqueeze(0), state,
                  deterministic=deterministic)
    return PolicyStep({k: v.squeeze(0) for k, v in step.actions.items()}, step.logp.squeeze(0),
                      step.entropy.squeeze(0), step.value.squeeze(0), step.state)
