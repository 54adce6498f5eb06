"""Config sections owned by `node/`: identity, data dir, the SAPO mix, checkpoints and
where metrics are logged."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from swarm.config.base import StrictModel


class NodeSection(StrictModel):
    name: str = "node"
    """Human-readable name used in logs and metrics (not an identity)."""
    swarm_id: str = Field("swarm-demo", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    """Which swarm to join; messages for other swarm ids are refused."""
    data_dir: Path = Path("runs/node")
    """Where checkpoints, metrics.jsonl and (by default) the key live."""
    key_file: Path | None = None
    """Ed25519 key file (mode 0600). Default: <data_dir>/node.key, created if missing."""
    checkpoint_every: int = Field(10, ge=1)
    """Write a checkpoint every this many rounds (and on Ctrl-C / SIGTERM)."""
    background_checkpoints: bool = True
    """Write checkpoints in a background thread while the next rounds train (the round
    waits only for an in-memory copy of the state, which costs one extra copy of model +
    optimizer in memory until written). A kill during a write loses that checkpoint: the
    restart resumes from the one before (at most one write is in flight). Off: each
    checkpoint is written before the next round starts."""
    checkpoint_optimizer: bool = True
    """Keep the optimizer state in checkpoints (for AdamW, twice the model's size): a
    resume continues exactly. Off: checkpoints are the model alone and a resume starts
    the optimizer fresh."""
    samples_keep: int = Field(200, ge=0, le=1 << 20)
    """Keep about this many recent sampled groups (completions and rewards) in
    `<data_dir>/samples.jsonl` for `swarm samples` (0: write none)."""

    @property
    def resolved_key_file(self) -> Path:
        return self.key_file if self.key_file is not None else self.data_dir / "node.key"


class SapoConfig(StrictModel):
    local_groups: int = Field(4, ge=0, le=256)
    """I: groups this node samples itself each round."""
    external_groups: int = Field(4, ge=0, le=256)
    """J: groups taken from peers each round (0 = a silo node)."""
    max_staleness: int = Field(2, ge=0, le=64)
    """Use a peer's group (or delta) for at most this many of our own rounds after it
    arrived. Measured by this node alone: there is no swarm-wide clock."""
    max_version_lag: int = Field(4, ge=0, le=1 << 20)
    """...and only while its policy version is at most this many optimizer steps behind
    the version its sender currently runs (the sender's newest envelope says). Async RL
    systems report stability up to about 4-6 versions of lag."""
    max_age_s: float | None = Field(None, gt=0)
    """Optional wall-clock bound on the same: seconds since arrival (off by default)."""
    per_sender_cap: int = Field(2, ge=1)
    """At most this many external groups from one sender per round."""
    pool_max_groups: int = Field(1024, ge=1)
    """Bound on groups held in the rollout pool."""
    pool_max_bytes: int = Field(64 << 20, ge=1 << 16)
    """Bound on the pool's text bytes."""

    @model_validator(mode="before")
    @classmethod
    def _retired_keys(cls, data: object) -> object:
        retired = ("max_ahead", "catch_up_quorum", "catch_up_min_rounds")
        if isinstance(data, dict):
            found = [key for key in retired if key in data]
            if found:
                raise ValueError(
                    f"{', '.join(found)}: retired with the swarm-round clock (protocol 2 "
                    "measures staleness locally); delete these keys, and see max_staleness "
                    "and max_version_lag"
                )
        return data

    @model_validator(mode="after")
    def _something_to_train(self) -> SapoConfig:
        if self.local_groups + self.external_groups == 0:
            raise ValueError("local_groups + external_groups must be > 0")
        return self


class LoggingConfig(StrictModel):
    backends: list[Literal["tensorboard", "wandb"]] = []
    """Extra places each round's metrics go, besides `<data_dir>/metrics.jsonl` (always):
    `tensorboard` (event files; `pip install tensorboard`) and `wandb` (Weights & Biases;
    `pip install wandb`). Off by default."""
    tensorboard_dir: Path | None = None
    """Where TensorBoard event files go. Default: <data_dir>/tensorboard."""
    wandb_project: str = Field("swarm", min_length=1, max_length=128)
    """The W&B project runs are logged to (the run is named after `node.name`)."""
    wandb_mode: Literal["online", "offline"] = "online"
    """`offline` writes the run under <data_dir>/wandb for a later `wandb sync`."""
