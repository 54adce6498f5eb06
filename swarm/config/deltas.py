"""Config section for weight-delta sharing (`[deltas]`), used by `node.deltas`.

Invariants: off by default; every combination that validates is usable (a bad one is
refused at load time, never at run time); `max_staleness >= every_k_steps`, because
deltas are merged once per share, so a peer's packet waits up to K rounds for it; a
knob of a scheme, encoding or aggregator not in use, or any knob while deltas are off,
is refused (it would do nothing).

Two schemes: `merge` (the default: add `mixing_weight` times a robust aggregate of
peers' compressed training deltas, `node.deltas`) and `choco` (CHOCO gossip averaging:
keep a public copy of each same-family peer, send compressed `x - xhat`, step toward
the copies, `node.choco_deltas`). `choco` keeps one float32 model-sized copy per peer
(`max_estimates`, plus this node's own): `4 * n_params * (max_estimates + 1)` bytes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from swarm.config.base import StrictModel, refuse_idle


class DeltasConfig(StrictModel):
    enabled: bool = False
    """Share compressed weight deltas with peers of the same model family, and merge theirs."""
    scheme: Literal["merge", "choco"] = "merge"
    """`merge`: add `mixing_weight * aggregate(peer training deltas)` (nothing pulls
    nodes together). `choco`: CHOCO gossip averaging (Koloskova et al. 2019): publish
    compressed `x - xhat`, keep a copy `xhat_j` of every peer, step
    `x += consensus_step * mean_j clip(xhat_j - xhat)`: nodes contract toward each other.
    `aggregator`, `trim_fraction` and `mixing_weight` apply to `merge` only."""
    consensus_step: float = Field(0.1, gt=0.0, le=1.0)
    """`choco`: gamma of the consensus step. It must be small for sparse top-k: on the
    toy problem of `tests/policy/test_choco.py` 0.1 contracts at density 1/16 and 0.5
    diverges; the smaller the density, the smaller it must be."""
    consensus_reference: Literal["current", "previous"] = "current"
    """`choco`: the own estimate the peers' copies are compared with: `current` (after
    this share, the paper's synchronous form) or `previous` (before it: peers' latest
    packets are about one share period old, so `current` also pulls a node back along
    the progress every node made in that period). `previous` holds one more float32
    model copy."""
    keyframe_every: int = Field(16, ge=1, le=100_000)
    """`choco`: every this many shares, publish the whole estimate (dense float16, about
    100x a 1/64 top-k share) instead of a diff, so that a peer that missed a packet
    (or joined, or restarted) resynchronizes. A peer stream seen at its start (a joiner,
    a restart) also triggers one at the next share."""
    max_estimates: int = Field(8, ge=1, le=1024)
    """`choco`: at most this many peer copies held, each a float32 copy of the
    trainable parameters (4 bytes per parameter: 4 MB for builtin:tiny, 2 GB for a 0.5B
    model); the peer heard from least recently is evicted for a new one."""
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
    """`merge`: clip each peer's delta norm to this multiple of the median peer norm
    (capped by this node's own last update norm). `choco`: clip each peer's consensus
    term `xhat_j - xhat` to this multiple of the median over peers. None: no clipping."""
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

    @model_validator(mode="after")
    def _used(self) -> DeltasConfig:
        if not self.enabled:
            knobs = tuple(name for name in type(self).model_fields if name != "enabled")
            refuse_idle(self, knobs, "enabled = true")
        if self.scheme == "merge":
            refuse_idle(self, _CHOCO_ONLY, 'scheme = "choco"')
        else:
            refuse_idle(self, _MERGE_ONLY, 'scheme = "merge"')
        if self.encoding != "topk":
            refuse_idle(self, ("density", "bits", "chunk_size"), 'encoding = "topk"')
        if self.aggregator != "trimmed_mean":
            refuse_idle(self, ("trim_fraction",), 'aggregator = "trimmed_mean"')
        return self


_CHOCO_ONLY = ("consensus_step", "consensus_reference", "keyframe_every", "max_estimates")
_MERGE_ONLY = ("aggregator", "trim_fraction", "mixing_weight")
