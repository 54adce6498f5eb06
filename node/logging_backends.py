"""Optional places a node's per-round metrics go besides metrics.jsonl: TensorBoard, W&B.

Invariants:
- Every backend logs the same scalars, `scalars(record)`, at step = the node's round,
  so curves line up across backends and with metrics.jsonl.
- A backend is imported only when configured; a missing package is a `ConfigError`
  at start naming the package and the install command.
- A backend that fails while the node runs (disk full, a W&B outage) is logged once,
  counted in `failures` and turned off; it never stops the node.
"""

from __future__ import annotations

import logging
import numbers
from pathlib import Path
from typing import Any, Protocol

from swarm.config import LoggingConfig
from swarm.errors import ConfigError

log = logging.getLogger("swarm.node.logging")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of one metrics line, flattened to `group/name` tags."""
    out: dict[str, float] = {}

    def put(tag: str, value: Any) -> None:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            out[tag] = float(value)

    put("reward/local", record.get("mean_local_reward"))
    put("reward/external", record.get("mean_external_reward"))
    evaluation = record.get("eval") or {}
    put("eval/accuracy", evaluation.get("accuracy"))
    put("policy_version", record.get("policy_version"))
    for key in ("local_groups", "external_groups", "pool_groups", "peers"):
        put(f"swarm/{key}", record.get(key))
    put("swarm/publish_failed", sum((record.get("publish_failed") or {}).values()))
    put("swarm/bytes_in", record.get("bytes_in"))
    put("swarm/bytes_out", record.get("bytes_out"))
    for reason, count in (record.get("drops") or {}).items():
        put(f"refused/{reason}", count)
    for phase, seconds in (record.get("seconds") or {}).items():
        put(f"seconds/{phase}", seconds)
    for key, value in (record.get("train") or {}).items():
        put(f"train/{key}", value)
    return out


class Backend(Protocol):
    name: str

    def log(self, values: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardBackend:
    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "logging.backends: 'tensorboard' needs the tensorboard package "
                "(pip install 'swarm-rl[tensorboard]')"
            ) from None
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbBackend:
    name = "wandb"

    def __init__(self, config: LoggingConfig, data_dir: Path, run_name: str, run_id: str,
                 settings: dict[str, Any]) -> None:  # fmt: skip
        try:
            import wandb
        except ImportError:
            raise ConfigError(
                "logging.backends: 'wandb' needs the wandb package (pip install 'swarm-rl[wandb]')"
            ) from None
        # A restarted node continues its run (same id); its rounds continue too.
        self.run = wandb.init(
            project=config.wandb_project,
            name=run_name,
            id=run_id,
            resume="allow",
            dir=str(data_dir),
            mode=config.wandb_mode,
            config=settings,
        )

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricBackends:
    """The configured backends of one node (possibly none)."""

    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends
        self.failures = 0

    @classmethod
    def open(
        cls, config: LoggingConfig, data_dir: Path, run_name: str, run_id: str,
        settings: dict[str, Any],
    ) -> MetricBackends:  # fmt: skip
        backends: list[Backend] = []
        for name in config.backends:
            if name == "tensorboard":
                backends.append(
                    TensorBoardBackend(config.tensorboard_dir or data_dir / "tensorboard")
                )
            else:
                backends.append(WandbBackend(config, data_dir, run_name, run_id, settings))
        return cls(backends)

    @property
    def active(self) -> bool:
        return bool(self.backends)

    def log(self, record: dict[str, Any]) -> None:
        if self.backends:
            self.log_scalars(scalars(record), int(record["round"]))

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        """`log` of a record whose `scalars` were taken already."""
        for backend in list(self.backends):
            try:
                backend.log(values, step)
            except Exception as exc:  # noqa: BLE001 - a third-party logger failed: drop it
                self.failures += 1
                self.backends.remove(backend)
                log.error("logging backend %s failed (%s: %s); it is off for this run",
                          backend.name, type(exc).__name__, exc)  # fmt: skip

    def close(self) -> None:
        for backend in self.backends:
            try:
                backend.close()
            except Exception as exc:  # noqa: BLE001 - must not hide the node's own exit
                log.error("logging backend %s did not close cleanly: %s", backend.name, exc)
        self.backends = []
