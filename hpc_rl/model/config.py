"""The policy network's shape."""

from __future__ import annotations

from dataclasses import dataclass

POOLINGS = ("attention", "max")
CORES = ("mlp", "lstm")


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the network; the spec of the environment decides which inputs and heads exist."""

    # The core between the encoders and the heads: "mlp" (a feed-forward layer: each step is decided from its own
    # observation, as Stable-Baselines3's and CleanRL's PPO do) or "lstm" (memory across steps, for partially observed
    # games such as the MOBA: conf/env/moba_*.yaml choose it). The feed-forward core is the default: fully observed
    # tasks learn as well without memory and each update costs a fraction of truncated BPTT.
    core: str = "mlp"
    lstm_size: int = 128  # the core's hidden size (OpenAI Five's LSTM: 4096, Honor of Kings': 1024)
    embed_size: int = 64  # unit embeddings, attention keys/queries, action embedding, global features
    entity_pooling: str = "attention"  # "attention" (a learned query per type) or "max" (Honor of Kings)
    chunk_len: int = 16  # truncated-BPTT chunk length; segments are cut into chunks of this many steps

    def __post_init__(self) -> None:
        if self.lstm_size < 1 or self.embed_size < 1:
            raise ValueError(f"lstm_size ({self.lstm_size}) and embed_size ({self.embed_size}) must be >= 1")
        if self.core not in CORES:
            raise ValueError(f"core {self.core!r} is not one of {CORES}")
        if self.entity_pooling not in POOLINGS:
            raise ValueError(f"entity_pooling {self.entity_pooling!r} is not one of {POOLINGS}")
        if self.chunk_len < 1:
            raise ValueError(f"chunk_len must be >= 1, got {self.chunk_len}")


@dataclass(frozen=True)
class GoNetConfig:
    """The Go network's tower (``hpc_rl.model.go_net``): ``blocks`` residual blocks of ``filters`` channels (ELF
    OpenGo: 20 x 256; AlphaGo Zero's smaller run 20 x 256, its larger 40 x 256)."""

    blocks: int = 20
    filters: int = 256

    def __post_init__(self) -> None:
        if self.blocks < 0 or self.filters < 1:
            raise ValueError(f"blocks must be >= 0 and filters >= 1, got {self.blocks}, {self.filters}")
