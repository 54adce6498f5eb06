"""Config sections owned by `node/`: identity, data dir, the SAPO mix, checkpoints and
where metrics are logged."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from swarm.config.base import StrictModel, refuse_idle


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
    metrics_rotate_mb: int = Field(64, ge=1, le=1 << 20)
    """Once `<data_dir>/metrics.jsonl` reaches this size it becomes the next compressed
    segment, `metrics-000001.jsonl.gz`, ... (about a tenth of the size); every reader
    (`swarm status`, the dashboard) reads the segments too."""
    metrics_keep_mb: int = Field(1024, ge=0)
    """Remove the oldest compressed metrics segments, but never the first (the run's
    start), once they take more than this (0: keep every segment). The built-in model
    writes about 2 GB of metrics a day before compression; a real model a few MB."""

    @property
    def resolved_key_file(self) -> Path:
        return self.key_file if self.key_file is not None else self.data_dir / "node.key"


class SapoConfig(StrictModel):
    local_groups: int = Field(4, ge=0, le=256)
    """I: groups this node samples itself each round."""
    external_groups: int = Field(4, ge=0, le=256)
    """J: groups taken from peers each round (0 = a silo node)."""
    max_staleness: int = Field(2, ge=0, le=64)
    """Use a peer's group for at most this many of our own rounds after it arrived.
    Measured by this node alone: there is no swarm-wide clock. (Weight deltas have their
    own bound, `deltas.max_staleness`.)"""
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
    external_selection: Literal["uniform", "signal"] = "uniform"
    """How the J external groups are chosen among the usable ones in the pool (the
    staleness bound, `per_sender_cap` and drawing without replacement hold for both).
    `uniform`: at random (the baseline). `signal`: highest expected learning signal
    first (`node.selection.expected_signal`: the re-scored rewards' standard deviation,
    largest at a pass rate of 1/2, times the task's novelty, lower for a task this node
    trained in its last `novelty_window` rounds); ties at random."""
    cohort_rounds: int = Field(0, ge=0, le=100_000)
    """Arrival cohorts, the Sybil bound for open swarms (0, the default: off). Senders
    this node first accepted a group of within the same window of this many of its
    rounds form one cohort, and each external slot goes to a cohort drawn by age
    (`cohort_ramp_rounds`) before the selection rule picks within it: a wave of 8 or 800
    fresh keys gets the share of one newcomer (`node.trust`, `docs/sybil.md`: 8 is what
    was measured). Off by default: windows count this node's rounds, so a node much
    faster than an honest peer sees its first group late and counts it a newcomer (a
    100x slower stub peer in simnet: the two fast nodes used its groups in 3 and 6
    rounds with cohorts, 5 and 4 without), and a swarm with no strangers gains nothing."""
    drop_copies: bool = False
    """Drop a group whose question and completions another sender's accepted group
    already had (`copied_group`, counted, not blamed): re-signed copies of others' work
    would be trained twice and let a key farm an honest peer's arrival cohort. Off by
    default: nodes with the same task stream and a peaked policy (or stub learners) can
    sample identical groups honestly."""
    cohort_ramp_rounds: int = Field(32, ge=1, le=100_000)
    """A new cohort's draw weight is (its age + 1) / this, up to 1: its share of the
    slots grows to an older cohort's over this many of our rounds."""
    cohort_weight: Literal["one", "earned"] = "one"
    """How a grown cohort weighs in the draw: as one sender (`one`: a wave of keys, once
    `cohort_ramp_rounds` old, weighs as much as all the peers that started together), or
    as many senders as it has active, earned one per `cohort_ramp_rounds` of its age
    (`earned`: a lone newcomer grows to one sender's fair share; a wave of keys stays
    bounded by its age, not its number). `docs/sybil.md` measures both."""
    cohort_older_share: float = Field(0.0, ge=0, le=100)
    """With `cohort_weight = "earned"`: a cohort weighs at most this share of all older
    cohorts together (0: no such cap). At 0.5 a late wave of keys never has more than a
    third of the slots against the peers that were here before it (`docs/sybil.md`)."""
    senders_first: bool = False
    """Spread the J picks over senders: no sender gets a second group while another
    sender with a usable group has none (then `per_sender_cap` applies)."""
    networks_first: bool = False
    """Spread the J picks over networks before senders: no network gets a second group
    while another network with a usable group has none. A sender's network is where
    this node first saw a direct connection to it (an IPv4 /24, an IPv6 /48; the
    transport's observation, never the peer's word); senders never seen directly (over
    MQTT, say) share one. So 8 or 800 keys run from one machine or subnet, even keys
    there from the swarm's first round, take one slot a round while other networks
    offer groups (`node.trust`, `docs/sybil.md`). Peers on one LAN or machine share a
    network too (then nothing changes among them)."""
    novelty_window: int = Field(8, ge=0, le=1024)
    """`signal` selection: a task (its prompt) trained in this many of our last rounds,
    locally or from a peer, counts as seen; each sighting divides its novelty
    (0: novelty off, only the reward spread counts)."""
    sampled_groups: int | None = Field(None, ge=1, le=4096)
    """S: groups this node samples each round (None: `local_groups`). With S > I the
    node does DAPO-style dynamic sampling: it samples S groups, publishes and scores all
    of them (its reward metrics are over all S), and trains on I of them, those with
    reward variance first. The dynamic-sampling silo control of `docs/sapo_grid.md`."""

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
        if self.sampled_groups is not None and self.sampled_groups < self.local_groups:
            raise ValueError(
                f"sampled_groups ({self.sampled_groups}) must be >= local_groups "
                f"({self.local_groups}): a node trains on at most local_groups of the groups "
                "it samples; raise sampled_groups or delete it (it defaults to local_groups)"
            )
        if self.sampled_groups is not None and self.local_groups == 0:
            raise ValueError(
                "sampled_groups needs local_groups > 0 (a node with local_groups = 0 "
                "trains on none of its own samples); delete sampled_groups"
            )
        if self.cohort_rounds == 0:
            refuse_idle(
                self,
                ("cohort_ramp_rounds", "cohort_weight", "cohort_older_share"),
                "cohort_rounds > 0",
            )
        elif self.cohort_weight != "earned":
            refuse_idle(self, ("cohort_older_share",), 'cohort_weight = "earned"')
        if self.external_selection != "signal":
            refuse_idle(self, ("novelty_window",), 'external_selection = "signal"')
        return self

    @property
    def groups_sampled(self) -> int:
        """S: groups sampled per round (`sampled_groups`, else `local_groups`)."""
        return self.local_groups if self.sampled_groups is None else self.sampled_groups


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

    @model_validator(mode="after")
    def _used(self) -> LoggingConfig:
        if "tensorboard" not in self.backends:
            refuse_idle(self, ("tensorboard_dir",), 'backends includes "tensorboard"')
        if "wandb" not in self.backends:
            refuse_idle(self, ("wandb_project", "wandb_mode"), 'backends includes "wandb"')
        return self
