"""Config section for weight-delta sharing (`[deltas]`), used by `node.deltas`.

Invariants: off by default; every combination that validates is usable (a bad one is
refused at load time, never at run time); `max_staleness >= every_k_steps`, because
deltas are merged once per share, so a peer's packet waits up to K rounds for it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from swarm.config.base import StrictModel


class DeltasConfig(StrictModel):
    enabled: bool = False
    """Share compressed weight deltas with peers of the same model family, and merge theirs."""
    every_k_steps: int = Field(4, ge=1, le=100_000)
    """K: publish `theta_now - theta_last_shared` and merge pending peer deltas every K
    optimizer steps."""
    encoding: Literal["topk", "dense_fp16"] = "topk"
    """`topk`: chunked top-k with error feedback, quantized values, Rice-coded indices.
    `dense_fp16`: every element as float16 (the uncompressed baseline, 2x smaller than
    float32)."""
    density: float = Field(1 / 64, gt=0.0, le=1.0)
    """Fraction of each chunk's entries sent (`topk`): 1/64 = 1.5625%."""
    bits: Literal[2, 3, 4, 8] = 2
    """Bits per sent value (`topk`), with one bfloat16 scale per chunk."""
    chunk_size: int = Field(4096, ge=64, le=1 << 20)
    """Elements per top-k chunk (`topk`); each tensor is chunked separately."""
    aggregator: Literal["trimmed_mean", "median", "mean"] = "trimmed_mean"
    """How peers' deltas are combined, coordinate by coordinate."""
    trim_fraction: float = Field(0.2, ge=0.0, lt=0.5)
    """`trimmed_mean`: fraction of peers dropped at each end of every coordinate."""
    clip_multiple: float | None = Field(2.0, gt=0.0)
    """Clip each peer's delta norm to this multiple of the median peer norm (capped by
    this node's own last update norm); None turns clipping off."""
    mixing_weight: float = Field(0.5, ge=0.0, le=1.0)
    """`params += mixing_weight * aggregate(peer deltas)` at each merge."""
    max_staleness: int = Field(8, ge=0, le=100_000)
    """Merge a peer's delta only within this many of our own rounds after it arrived."""
    max_pending_peers: int = Field(64, ge=1, le=4096)
    """At most this many peers' packets held for the next merge (one per peer)."""

    @model_validator(mode="after")
    def _staleness_covers_a_period(self) -> DeltasConfig:
        if self.max_staleness < self.every_k_steps:
            raise ValueError(
                "max_staleness must be >= every_k_steps (deltas wait up to K rounds for a merge)"
            )
        return self
