"""The node configuration: one TOML file per node, validated strictly.

Invariants:
- Every model forbids unknown keys, so a typo is an error, not a silent default.
- `load_config` turns every failure (missing file, bad TOML, bad field) into one
  `ConfigError` naming the file, the field path and what is allowed.
- Each package receives only its own section (`config.transport`, `config.train`, ...).
- The field defaults are the one set of defaults (`swarm.config.learning`,
  `swarm.config.tasks`); the seeds' default is per node: derived from the node's key by
  `with_node_seeds`, which the node calls before anything reads a seed.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError, model_validator

from swarm.config.base import StrictModel
from swarm.config.deltas import DeltasConfig
from swarm.config.learning import ModelConfig, PromptConfig, SamplerConfig, TrainConfig
from swarm.config.models import BUILTIN_PREFIX
from swarm.config.network import (
    GossipConfig,
    Libp2pTransportConfig,
    MemoryTransportConfig,
    MqttTransportConfig,
    TransportConfig,
)
from swarm.config.node import LoggingConfig, NodeSection, SapoConfig
from swarm.config.tasks import EvalConfig, RewardsConfig, TasksConfig, TaskSpec
from swarm.errors import ConfigError

__all__ = [
    "DeltasConfig",
    "EvalConfig",
    "GossipConfig",
    "Libp2pTransportConfig",
    "LoggingConfig",
    "MemoryTransportConfig",
    "ModelConfig",
    "MqttTransportConfig",
    "NodeConfig",
    "NodeSection",
    "PromptConfig",
    "RewardsConfig",
    "SamplerConfig",
    "SapoConfig",
    "TaskSpec",
    "TasksConfig",
    "TrainConfig",
    "TransportConfig",
    "derived_seed",
    "format_validation_error",
    "load_config",
    "parse_config",
]

MAX_DERIVED_SEED = 2**53 - 1
"""Derived seeds stay below 2**53, so every JSON/JS peer reads them exactly."""


def derived_seed(peer_id: str, purpose: str) -> int:
    """A node's default seed for `purpose` ("model" or "tasks"), from its peer id."""
    digest = hashlib.blake2b(f"swarm-seed:{purpose}:{peer_id}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") & MAX_DERIVED_SEED


class NodeConfig(StrictModel):
    node: NodeSection = NodeSection()
    """Identity, swarm id, data dir, checkpoints."""
    transport: TransportConfig = Libp2pTransportConfig()
    """How this node reaches peers: `libp2p` (default), `mqtt` or `memory`."""
    gossip: GossipConfig = GossipConfig()
    """Limits on what peers may send."""
    model: ModelConfig = ModelConfig()
    """The policy model."""
    prompt: PromptConfig = PromptConfig()
    """How a task's question is rendered for this node's model (chat template or plain)."""
    sampler: SamplerConfig = SamplerConfig()
    """How rollouts are generated."""
    train: TrainConfig = TrainConfig()
    """GRPO hyper-parameters."""
    sapo: SapoConfig = SapoConfig()
    """The local/external mix and staleness bound."""
    tasks: TasksConfig = TasksConfig()
    """Which verifiable tasks this node samples."""
    rewards: RewardsConfig = RewardsConfig()
    """How completions are scored."""
    deltas: DeltasConfig = DeltasConfig()
    """Compressed weight-delta sharing within one model family (off by default)."""
    eval: EvalConfig = EvalConfig()
    """Greedy accuracy on a fixed held-out set of tasks, every few rounds."""
    logging: LoggingConfig = LoggingConfig()
    """Optional metric backends (TensorBoard, W&B) besides metrics.jsonl."""

    @model_validator(mode="after")
    def _lora_needs_transformers(self) -> NodeConfig:
        if self.model.lora.enabled and self.sampler.backend == "vllm":
            raise ValueError(
                "model.lora.enabled with sampler.backend = 'vllm' is not supported yet: "
                "use backend = 'transformers', or full fine-tuning with vllm"
            )
        return self

    @model_validator(mode="after")
    def _sampler_on_ranks(self) -> NodeConfig:
        sampler, train = self.sampler, self.train
        if sampler.data_parallel and train.ranks == 1:
            raise ValueError(
                "sampler.data_parallel = true needs train.ranks > 1 (each training rank "
                "samples a share): set train.parallel and train.ranks, or remove it"
            )
        if sampler.backend == "vllm" and train.ranks > 1 and sampler.data_parallel is False:
            raise ValueError(
                "sampler.data_parallel = false with backend = 'vllm' and train.ranks > 1: "
                "vLLM builds its engines over the node's process group, so every rank holds "
                "one and samples (remove data_parallel, or set it to true)"
            )
        if self.samples_on_every_rank():
            if sampler.overlap:
                raise ValueError(
                    "sampler.overlap with sampling on every training rank: the ranks sample "
                    "and train in turn, so there is nothing to overlap (set overlap = false)"
                )
            tp = sampler.vllm_tensor_parallel_size
            local = train.local_ranks or train.ranks
            if train.ranks % tp or local % tp:
                raise ValueError(
                    f"sampler.vllm_tensor_parallel_size = {tp} must divide train.ranks "
                    f"({train.ranks}) and the ranks on each machine ({local}): each engine "
                    "spans that many consecutive ranks of one machine"
                )
        return self

    def samples_on_every_rank(self) -> bool:
        """Whether each training rank samples a share (`sampler.data_parallel`, resolved)."""
        if self.train.ranks == 1:
            return False
        if self.sampler.data_parallel is None:  # no extra memory: vLLM's own, DDP's replica
            ddp = self.train.parallel == "ddp" and not self.sampler.overlap
            return self.sampler.backend == "vllm" or ddp
        return self.sampler.data_parallel

    @model_validator(mode="after")
    def _deltas_need_one_family(self) -> NodeConfig:
        if (
            self.deltas.enabled
            and self.model.name_or_path.startswith(BUILTIN_PREFIX)
            and self.model.seed is None
        ):
            raise ValueError(
                "deltas.enabled with a built-in model needs model.seed set, the same on "
                "every node that shares deltas: unset, each node's seed comes from its key, "
                "so each built-in model starts from other weights (its own model family) "
                "and no peer's deltas would ever be merged"
            )
        return self

    def with_node_seeds(self, peer_id: str) -> NodeConfig:
        """This config with each unset seed (`model.seed`, `tasks.seed`) derived from
        the node's peer id; set seeds are kept. The same key gives the same seeds, so a
        resumed node continues its task stream."""
        update = {}
        if self.model.seed is None:
            seed = derived_seed(peer_id, "model")
            update["model"] = self.model.model_copy(update={"seed": seed})
        if self.tasks.seed is None:
            seed = derived_seed(peer_id, "tasks")
            update["tasks"] = self.tasks.model_copy(update={"seed": seed})
        return self.model_copy(update=update) if update else self


def _allowed_hint(error: dict[str, Any]) -> str:
    ctx = error.get("ctx") or {}
    if "expected" in ctx:
        return f" (allowed: {ctx['expected']})"
    if error.get("type") == "extra_forbidden":
        return " (unknown key: remove it or check its spelling)"
    if error.get("type") == "union_tag_invalid":
        return " (allowed: type = 'libp2p' | 'mqtt' | 'memory')"
    return ""


def format_validation_error(source: str, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        path = ".".join(str(p) for p in error["loc"]) or "(top level)"
        lines.append(f"{source}: {path}: {error['msg']}{_allowed_hint(error)}")
    return "\n".join(lines)


def parse_config(data: dict[str, Any], source: str = "<config>") -> NodeConfig:
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None


def load_config(path: str | Path) -> NodeConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: config file not found (create one with `swarm init {path}`)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(data, str(path))
