"""The experience schema, declared once, and everything derived from it.

A batch holds trajectory segments of T steps for B agents, time-major. ``batch_fields`` is the one declaration of
its fields; each has an axis kind that fixes its leading dimensions:

=========  ==========================  ===========================================================================
kind       leading dimensions          fields
=========  ==========================  ===========================================================================
``STEP``   (T, B)                      ``obs/<key>``, ``hero``, ``starts``, ``actions/<head>``, ``logp``,
                                       ``value``, ``reward``, ``weight``, ``done``, ``version``, ``info/<name>``
``CHUNK``  (T / chunk_len, B)          ``chunk_h``, ``chunk_c``: the LSTM state before every BPTT chunk's first step
``AGENT``  (B,)                        ``bootstrap_value``: the value of the observation after the last step
=========  ==========================  ===========================================================================

Go's self-play (``env.name=go``) trains on whole games instead, as ELF OpenGo's trainer receives them:
``game_fields`` declares one game's record (kind ``POSITION``: one row per searched position, up to the longest
game; kind ``GAME``: one value per game), and ``GameSchema`` derives its wire layout, packing and checks.

From the PPO schema come the buffer an inference rank (or the serial runner) fills one step at a time (``SegmentBuffer``), a
segment's wire layout and its packing (``SegmentSchema.layout``, ``pack``, ``unpack``), the join of segments into a
learner's batch (``SegmentSchema.concat``) and the finite-number checks of ``validate``. An environment that declares
``EnvSpec.step_infos`` gets each as a STEP field ``info/<name>``: it travels from the env rank to the learner with no
other edit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from hpc_rl.algo.bptt import LSTMState
from hpc_rl.config import TrainConfig
from hpc_rl.envs.api import EnvSpec
from hpc_rl.model.policy import HEADS, PolicyStep
from hpc_rl.transport.layout import ArrayLayout

STEP, CHUNK, AGENT = "step", "chunk", "agent"
POSITION, GAME = "position", "game"  # Go's record: per searched position, per game
WIRE_IDS = "ids"  # the wire's accounting field: (env rank, that env rank's segment number)


class SegmentError(ValueError):
    """A segment that must not be trained on."""


@dataclass(frozen=True)
class Field:
    """One named array of a batch: per-agent trailing ``shape`` behind the leading dimensions of its ``kind``."""

    name: str
    kind: str  # STEP, CHUNK or AGENT; in Go's record POSITION or GAME (GameSchema.shape)
    shape: tuple[int, ...]
    dtype: np.dtype

    def lead(self, segment_len: int, num_agents: int, chunk_len: int) -> tuple[int, ...]:
        return {STEP: (segment_len, num_agents), CHUNK: (segment_len // chunk_len, num_agents),
                AGENT: (num_agents,)}[self.kind]

    @property
    def agent_axis(self) -> int:
        """The axis segments are joined along."""
        return 0 if self.kind == AGENT else 1


def batch_fields(spec: EnvSpec, lstm_size: int) -> tuple[Field, ...]:
    """Every field of a batch, in wire order."""
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    fields = [Field(f"obs/{key}", STEP, shape[2:], np.dtype(dtype))
              for key, (shape, dtype) in spec.observation_shapes(1).items()]
    fields += [Field("hero", STEP, (), i64), Field("starts", STEP, (), np.dtype(bool))]
    fields += [Field(f"actions/{head}", STEP, (), i64) for head in HEADS]
    fields += [Field(name, STEP, (), f32) for name in ("logp", "value", "reward", "weight")]
    fields += [Field("done", STEP, (), np.dtype(bool)), Field("version", STEP, (), i64)]
    fields += [Field(f"info/{info.name}", STEP, info.shape, np.dtype(info.dtype)) for info in spec.step_infos]
    fields += [Field("chunk_h", CHUNK, (lstm_size,), f32), Field("chunk_c", CHUNK, (lstm_size,), f32),
               Field("bootstrap_value", AGENT, (), f32)]
    return tuple(fields)


class Batch:
    """Named tensors of one batch (``batch_fields``): ``batch.reward``, ``batch["info/x"]``, and the groups
    ``batch.obs`` and ``batch.actions`` keyed without their prefix."""

    def __init__(self, fields: dict[str, torch.Tensor]):
        self.fields = fields

    def __getattr__(self, name: str) -> torch.Tensor:
        # Reached only for names that are not attributes; vars() rather than self.fields, which an object being
        # unpickled does not have yet.
        try:
            return vars(self)["fields"][name]
        except KeyError:
            raise AttributeError(f"the batch has no field {name!r}") from None

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.fields[name]

    def group(self, prefix: str) -> dict[str, torch.Tensor]:
        """The fields ``<prefix>/<key>`` keyed by ``key``."""
        cut = len(prefix) + 1
        return {k[cut:]: v for k, v in self.fields.items() if k.startswith(prefix + "/")}

    @property
    def obs(self) -> dict[str, torch.Tensor]:
        return self.group("obs")

    @property
    def actions(self) -> dict[str, torch.Tensor]:
        return self.group("actions")

    def replace(self, **changes: torch.Tensor) -> Batch:
        unknown = set(changes) - set(self.fields)
        if unknown:
            raise KeyError(f"the batch has no fields {sorted(unknown)}")
        return Batch({**self.fields, **changes})

    @property
    def num_samples(self) -> int:
        return int(self.fields["weight"].sum())


def policy_step_fields(step: PolicyStep) -> dict[str, np.ndarray]:
    """What the policy computed for one step, as the STEP fields it fills."""
    out = {f"actions/{head}": step.actions[head].cpu().numpy() for head in HEADS}
    out["logp"] = step.logp.cpu().numpy()
    out["value"] = step.value.cpu().numpy()
    return out


@dataclass(frozen=True)
class SegmentSchema:
    """The fields and sizes of one segment: ``segment_len`` steps of ``num_agents`` agents (one env rank's copies ×
    agents per copy); on the wire, float32 observations may travel as float16."""

    spec: EnvSpec
    num_agents: int
    segment_len: int
    chunk_len: int
    lstm_size: int
    fp16_observations: bool = False

    @classmethod
    def of_run(cls, config: TrainConfig, spec: EnvSpec) -> SegmentSchema:
        """The segments of one env rank of a run: its ``env.num_envs`` copies × the spec's agents, or with
        populations (``hpc_rl.populations``) those of one population, a segment each."""
        return cls(spec, config.env.num_envs * spec.num_agents // config.populations, config.pipeline.segment_len,
                   config.model.chunk_len, config.model.lstm_size, config.transport.fp16_observations)

    def __post_init__(self) -> None:
        if self.segment_len % self.chunk_len:
            raise ValueError(f"segment_len {self.segment_len} is not a multiple of the BPTT chunk length "
                             f"{self.chunk_len}")

    @cached_property
    def fields(self) -> tuple[Field, ...]:
        return batch_fields(self.spec, self.lstm_size)

    def shape(self, field: Field) -> tuple[int, ...]:
        return field.lead(self.segment_len, self.num_agents, self.chunk_len) + field.shape

    @cached_property
    def layout(self) -> ArrayLayout:
        """The wire layout: every field, then the accounting ids."""
        arrays = {f.name: (self.shape(f), f.dtype) for f in self.fields}
        arrays[WIRE_IDS] = ((2,), np.dtype(np.int64))
        half = [f.name for f in self.fields
                if self.fp16_observations and f.name.startswith("obs/") and f.dtype == np.float32]
        return ArrayLayout(arrays, half=half)

    def buffer(self) -> SegmentBuffer:
        return SegmentBuffer(self)

    def pack(self, arrays: Mapping[str, np.ndarray | torch.Tensor], env_rank: int, seq: int,
             out: np.ndarray | None = None) -> np.ndarray:
        """A segment's fields (``Batch.fields``, or ``SegmentBuffer.finish``'s arrays) and its ids as one
        payload."""
        wire = {name: np.asarray(value) for name, value in arrays.items()}
        wire[WIRE_IDS] = np.array([env_rank, seq], dtype=np.int64)
        return self.layout.pack(wire, out)

    def unpack(self, payload: np.ndarray) -> tuple[Batch, int, int]:
        """``(batch, env_rank, seq)``; the batch owns its memory (the payload may be reused)."""
        if payload.size < self.layout.nbytes:
            raise SegmentError(f"segment of {payload.size} bytes, the layout needs {self.layout.nbytes}")
        arrays = self.layout.unpack(payload)
        env_rank, seq = (int(x) for x in arrays.pop(WIRE_IDS))
        return Batch({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}), env_rank, seq

    def concat(self, batches: Sequence[Batch]) -> Batch:
        """Join segments along the agent axis into one learner batch."""
        if not batches:
            raise ValueError("no segments to join")
        if len(batches) == 1:
            return batches[0]
        return Batch({f.name: torch.cat([b.fields[f.name] for b in batches], dim=f.agent_axis)
                      for f in self.fields})


class SegmentBuffer:
    """Fills one segment step by step, then hands it out as a ``Batch``.

    ``store(t, values)`` takes every STEP field of step ``t`` (a missing or unknown one raises: a stale value must
    never be trained on); ``store_state`` the LSTM state before a chunk's first step."""

    def __init__(self, schema: SegmentSchema):
        self.schema = schema
        self.arrays = {f.name: np.zeros(schema.shape(f), f.dtype) for f in schema.fields}
        self.step_names = frozenset(f.name for f in schema.fields if f.kind == STEP)

    def store_state(self, t: int, state: LSTMState) -> None:
        """Record the LSTM state before step ``t`` if ``t`` starts a chunk."""
        chunk_len = self.schema.chunk_len
        if t % chunk_len == 0:
            self.arrays["chunk_h"][t // chunk_len] = state[0].cpu().numpy()
            self.arrays["chunk_c"][t // chunk_len] = state[1].cpu().numpy()

    def store(self, t: int, values: Mapping[str, np.ndarray]) -> None:
        if values.keys() != self.step_names:
            missing, unknown = self.step_names - values.keys(), values.keys() - self.step_names
            raise KeyError(f"step {t}: missing fields {sorted(missing)}, unknown fields {sorted(unknown)}")
        for name, value in values.items():
            self.arrays[name][t] = value

    def finish(self, bootstrap_value: torch.Tensor) -> dict[str, np.ndarray]:
        """Every field of the full segment, the bootstrap value included (the buffer's own arrays: pack or copy
        them before the next step is stored)."""
        self.arrays["bootstrap_value"][:] = bootstrap_value.cpu().numpy()
        return self.arrays



def validate(batch: Batch, schema: SegmentSchema, max_version: int) -> None:
    """Raise SegmentError if the segment cannot be trained on: non-finite numbers in any float field, actions out of
    range or illegal under the stored masks, weights outside [0, 1], a behaviour version from the future, or
    behaviour log-probabilities above 0."""
    for f in schema.fields:
        value = batch.fields[f.name]
        # A sum is finite when every element is, unless it overflowed: one pass without a mask tensor for the common
        # case, and the element-wise check only when the sum is not finite.
        if value.is_floating_point() and not (torch.isfinite(value.sum()) or torch.isfinite(value).all()):
            raise SegmentError(f"non-finite values in {f.name}")
    spec = schema.spec
    if ((batch.weight < 0) | (batch.weight > 1)).any():
        raise SegmentError("training weights outside [0, 1]")
    trained = batch.weight > 0
    action = batch.actions["action"]
    if ((action < 0) | (action >= spec.num_actions)).any():
        raise SegmentError("primary action out of range")
    legal = torch.gather(batch.obs["action_mask"], -1, action.clamp(0, spec.num_actions - 1).unsqueeze(-1)).squeeze(-1)
    if (trained & ~legal).any():
        raise SegmentError("an action illegal under its action mask")
    if (batch.version[trained] > max_version).any():
        raise SegmentError(f"behaviour version beyond the learner's {max_version}")
    if trained.any() and not (batch.logp[trained] <= 1e-4).all():
        raise SegmentError("behaviour log-probabilities above 0")


# ---------------------------------------------------------------------------------------------------------------------
# Go: one self-play game's record per ring slot.

def game_fields(board_size: int) -> tuple[Field, ...]:
    """Every field of one Go game's record (``hpc_rl.envs.go_search.GameRecord``), in wire order."""
    from hpc_rl.envs.go import NUM_PLANES

    f32, i64, b = np.dtype(np.float32), np.dtype(np.int64), np.dtype(bool)
    return (Field("planes", POSITION, (NUM_PLANES, board_size, board_size), f32),
            Field("pi", POSITION, (board_size * board_size + 1,), f32), Field("z", POSITION, (), f32),
            Field("to_play", POSITION, (), i64), Field("actions", POSITION, (), i64),
            Field("versions", POSITION, (), i64),
            Field("length", GAME, (), i64), Field("winner", GAME, (), i64), Field("resigned", GAME, (), b),
            Field("playout", GAME, (), b), Field("would_resign", GAME, (), i64), Field("moves", GAME, (), i64),
            Field("ownership", GAME, (board_size * board_size,), np.dtype(np.int8)))


@dataclass(frozen=True)
class GameSchema:
    """One game's record on the wire: ``max_length`` rows of positions (the longest game; a shorter one is padded
    with zeros), the per-game fields, and the accounting ids (env rank, its game number)."""

    board_size: int
    max_length: int

    @cached_property
    def fields(self) -> tuple[Field, ...]:
        return game_fields(self.board_size)

    def shape(self, field: Field) -> tuple[int, ...]:
        return ((self.max_length,) if field.kind == POSITION else (1,)) + field.shape

    @cached_property
    def layout(self) -> ArrayLayout:
        arrays = {f.name: (self.shape(f), f.dtype) for f in self.fields}
        arrays[WIRE_IDS] = ((2,), np.dtype(np.int64))
        return ArrayLayout(arrays)

    def pack(self, record, env_rank: int, seq: int, out: np.ndarray | None = None) -> np.ndarray:
        """A ``GameRecord`` and its ids as one payload."""
        n = len(record.z)
        if not 1 <= n <= self.max_length:
            raise ValueError(f"a game of {n} positions; the record holds 1 to {self.max_length}")
        wire = {}
        for f in self.fields:
            if f.kind == POSITION:
                wire[f.name] = np.zeros(self.shape(f), f.dtype)
                wire[f.name][:n] = getattr(record, f.name)
            else:
                wire[f.name] = np.array([n if f.name == "length" else getattr(record, f.name)], f.dtype)
        wire[WIRE_IDS] = np.array([env_rank, seq], dtype=np.int64)
        return self.layout.pack(wire, out)

    def unpack(self, payload: np.ndarray):
        """``(GameRecord, env_rank, seq)``, copied out of the payload (which may be reused); raises SegmentError if
        the record must not be trained on (``validate_game``)."""
        from hpc_rl.envs.go_search import GameRecord

        if payload.size < self.layout.nbytes:
            raise SegmentError(f"game record of {payload.size} bytes, the layout needs {self.layout.nbytes}")
        arrays = self.layout.unpack(payload)
        env_rank, seq = (int(x) for x in arrays.pop(WIRE_IDS))
        n = int(arrays["length"][0])
        if not 1 <= n <= self.max_length:
            raise SegmentError(f"game record of length {n}; 1 to {self.max_length} fit")
        values = {f.name: (np.array(arrays[f.name][:n]) if f.kind == POSITION
                           else np.array(arrays[f.name][0]) if f.shape else arrays[f.name][0].item())
                  for f in self.fields if f.name != "length"}
        record = GameRecord(**values)
        validate_game(record)
        return record, env_rank, seq


def validate_game(record) -> None:
    """Raise SegmentError if a game's record cannot be trained on: non-finite planes or pi, a pi that is not a
    distribution, an outcome z outside {-1, 0, 1} or not the winner's from the player to move's view, an ownership
    outside {-1, 0, 1}."""
    if not (np.isfinite(record.planes).all() and np.isfinite(record.pi).all()):
        raise SegmentError("non-finite values in a game's planes or pi")
    if (record.pi < 0).any() or not np.allclose(record.pi.sum(1), 1.0, atol=1e-4):
        raise SegmentError("a position's pi is not a distribution")
    if not np.isin(record.ownership, (-1, 0, 1)).all():
        raise SegmentError("a game's ownership holds values other than -1, 0 and 1")
    from hpc_rl.envs.go_search import outcome_targets

    if record.winner not in (-1, 0, 1) or not np.array_equal(record.z, outcome_targets(record.to_play,
                                                                                        record.winner)):
        raise SegmentError(f"outcomes z that are not winner {record.winner}'s from the player to move's view")
