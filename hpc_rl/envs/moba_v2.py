"""Game version 2 of the MOBA: version 1 (``hpc_rl.envs.moba``) with one more hero attribute and one more action.

OpenAI Five's game changed under its training (new heroes, items, rules); each change that altered the observation
or the action space took a model surgery, and the new game was played beside the old one at a rising rate
(Berner et al. 2019, section 3.3 and appendix B). Version 2 is such a change for the embedded MOBA:

- **attribute**: every hero's row of ``entities/heroes`` gets a 20th feature, ``attack timer``, the time until the
  hero's next attack as a fraction of its attack period (``UTIMER / UPERIOD`` of the game state, 0 when ready; 0 for
  a hero its team does not see, as every feature of an unseen unit). Version 1 shows only whether it is 0
  (``attack ready``).
- **action**: a 5th primary action, ``heal``, reading neither the move nor the target head: the hero regains
  ``HEAL_FRACTION`` of its max hp at once, then cannot heal again for ``HEAL_COOLDOWN`` steps. It is legal when the
  hero is alive, not stunned, hurt and off that cooldown (``action_mask``); an illegal heal is played as ``noop``,
  as every illegal action. Healing happens before the rest of the step (the game's own rules then play the hero as
  idle); the hp it restores counts in the ``hp`` reward event like any other change of hp. The cooldowns of a copy
  start at 0 with each game.

``MobaV2Env`` is a layer over ``MobaEnv`` and leaves the game of version 1 untouched: version 1 never imports this
module, and the files the scripted bot's identity hashes (``scripted.SCRIPTED_SOURCES``) do not change.

Old and new side by side: every copy presents version 2's layout, but each game is played under version 2's rules
with probability ``new_version_share`` (``set_new_version_share``), drawn when the game starts from the copy's seed
and game index (so a copy draws the same versions whatever the other copies do, and a rising share moves the same
games to version 2 first); the other games are version 1 exactly: the new attribute holds 0 and ``heal`` is never
legal, so the policy's surgery (``hpc_rl.surgery``) plays them as the policy before it. ``new_version`` says which
copies play version 2 now.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hpc_rl.envs.api import Actions, EnvSpec, Obs
from hpc_rl.envs.moba import GGAME, HSTUN, IALIVE, UHP, UMAXHP, UPERIOD, UTIMER, MobaEnv
from hpc_rl.envs.moba_config import A_NOOP, ACTIONS, EV_HP, HERO_FEATURES, MobaConfig

ACTIONS_V2 = (*ACTIONS, "heal")
A_HEAL = len(ACTIONS)  # the new action is last
HEAL_USES_MOVE, HEAL_USES_TARGET = False, False
ATTACK_TIMER = HERO_FEATURES  # the new attribute is the hero rows' last column
HEAL_FRACTION = 0.25  # of max hp, restored at once
HEAL_COOLDOWN = 150  # steps (20 game-seconds at 7.5 decisions per second)
_VERSION_STREAM = 0x76657232  # "ver2": the draws of game versions, apart from the game's own randomness


def spec_v2(config: MobaConfig) -> EnvSpec:
    """Version 1's spec with the hero attribute and the heal action appended."""
    spec = config.spec()
    entities = tuple(replace(e, num_features=e.num_features + 1) if e.name == "heroes" else e for e in spec.entities)
    return replace(spec, entities=entities, num_actions=spec.num_actions + 1,
                   action_uses_move=(*spec.action_uses_move, HEAL_USES_MOVE),
                   action_uses_target=(*spec.action_uses_target, HEAL_USES_TARGET))


def game_draw(seed: int, game: int) -> float:
    """A copy's uniform draw in [0, 1) for its game ``game`` (``seed``: the copy's seed): version 2 where it is below
    the share."""
    return float(np.random.default_rng([int(seed), int(game), _VERSION_STREAM]).random())


class MobaV2Env:
    """``num_envs`` copies of game version 2 (a ``VecEnv``), a share ``new_version_share`` of the games under its
    rules and the others under version 1's, all in version 2's layout (module docstring)."""

    def __init__(self, config: MobaConfig, num_envs: int, first_copy: int = 0, new_version_share: float = 1.0):
        self.base = MobaEnv(config, num_envs, first_copy)
        self.config = config
        self.spec = spec_v2(config)
        self.num_envs = num_envs
        self.first_copy = first_copy
        heroes = config.spec().entities[0].max_count
        self.heal_cooldown = np.zeros((num_envs, heroes))  # steps until each hero may heal again
        self.new_version = np.ones(num_envs, dtype=bool)  # copies whose current game plays version 2's rules
        self.new_version_share = 1.0
        self.set_new_version_share(new_version_share)

    def set_new_version_share(self, share: float) -> None:
        """The share of the games starting from now on that play version 2's rules (the games under way go on)."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"the new game version's share must be in [0, 1], got {share}")
        self.new_version_share = float(share)

    def _draw_versions(self, copies: np.ndarray) -> None:
        for e in np.flatnonzero(copies):
            self.new_version[e] = game_draw(self.base.seeds[e], self.base.gi[e, GGAME]) < self.new_version_share

    def reset(self, seed: int) -> Obs:
        obs = self.base.reset(seed)
        self.heal_cooldown[:] = 0.0
        self._draw_versions(np.ones(self.num_envs, dtype=bool))
        return self._extend(obs)

    def heal_legal(self) -> np.ndarray:
        """(E, heroes) bool: who may heal now (alive, not stunned, hurt, off cooldown, in a version 2 game)."""
        heroes = self.heal_cooldown.shape[1]
        uf, ui, hf = self.base.uf[:, :heroes], self.base.ui[:, :heroes], self.base.hf
        return ((ui[..., IALIVE] == 1) & (hf[..., HSTUN] <= 0.0) & (uf[..., UHP] < uf[..., UMAXHP])
                & (self.heal_cooldown <= 0.0) & self.new_version[:, None])

    def step(self, actions: Actions) -> tuple[Obs, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        if "action" not in actions:
            raise ValueError("actions lack the 'action' head")
        action = np.asarray(actions["action"])
        if action.shape != (self.num_envs, self.spec.num_agents):
            raise ValueError(f"actions['action'] has shape {action.shape}, expected "
                             f"{(self.num_envs, self.spec.num_agents)}")
        if action.size and (action.min() < 0 or action.max() >= self.spec.num_actions):
            raise ValueError(f"actions['action'] must lie in [0, {self.spec.num_actions}), got "
                             f"[{action.min()}, {action.max()}]")
        heal = action == A_HEAL
        healed = heal & self.heal_legal()  # agent a is hero slot a
        gain = np.zeros(healed.shape)
        if healed.any():
            hp = self.base.uf[:, :healed.shape[1], UHP]
            top = self.base.uf[:, :healed.shape[1], UMAXHP]
            new_hp = np.where(healed, np.minimum(top, hp + HEAL_FRACTION * top), hp)
            gain = (new_hp - hp) / top
            hp[...] = new_hp  # a view of the game state: the rest of the step sees the healed hero
            self.heal_cooldown[healed] = HEAL_COOLDOWN
        obs, events, dones, infos = self.base.step({**actions, "action": np.where(heal, A_NOOP, action)})
        events[..., EV_HP] += gain.astype(np.float32)
        np.maximum(self.heal_cooldown - 1.0, 0.0, out=self.heal_cooldown)
        if dones.any():  # the base env started these copies' next games
            self.heal_cooldown[dones] = 0.0
            self._draw_versions(dones)
        return self._extend(obs), events, dones, infos

    def observe(self) -> Obs:
        return self._extend(self.base.observe())

    def _extend(self, obs: Obs) -> Obs:
        """Version 1's observation in version 2's layout: the attack timers appended to the hero rows, the heal's
        legality to the action mask (both 0 / False in version 1 games)."""
        heroes = self.heal_cooldown.shape[1]
        uf = self.base.uf[:, :heroes]
        timer = np.maximum(uf[..., UTIMER], 0.0) / uf[..., UPERIOD]  # (E, heroes), as every agent sees it ...
        seen = obs["entities/heroes/mask"] & self.new_version[:, None, None]  # ... where its team sees the hero
        column = np.where(seen, timer[:, None, :], 0.0).astype(np.float32)
        legal = self.heal_legal()
        return {**obs, "entities/heroes": np.concatenate([obs["entities/heroes"], column[..., None]], axis=-1),
                "action_mask": np.concatenate([obs["action_mask"], legal[..., None]], axis=-1)}

    def __getattr__(self, name: str):
        # The game state and everything else (uf, hf, layout, slot ranges: what replays draw) are the base env's.
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)
