"""The network and fault sections of a scenario file (`simnet.scenario` loads them).

The link model (topology, latency distribution, bandwidth, loss, reordering, the largest
message a link carries whole) and the faults a run injects (partitions that start and
heal, nodes that leave and rejoin, churn over a window), as pydantic models.

Invariants: every model forbids unknown keys and documents each field; times are
virtual seconds of the run; a fault's end comes after its start (validated); nothing
here imports simnet's engine, node/ or torch: the schema is plain data.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from swarm.config.base import StrictModel

# ---- network ---------------------------------------------------------------------------


class ConstantLatency(StrictModel):
    type: Literal["constant"] = "constant"
    ms: float = Field(50.0, ge=0)
    """One-way propagation delay of every transmission, in milliseconds."""


class UniformLatency(StrictModel):
    type: Literal["uniform"] = "uniform"
    low_ms: float = Field(20.0, ge=0)
    """Shortest one-way delay, in milliseconds."""
    high_ms: float = Field(80.0, ge=0)
    """Longest one-way delay, in milliseconds (drawn uniformly per transmission)."""

    @model_validator(mode="after")
    def _ordered(self) -> UniformLatency:
        if self.high_ms < self.low_ms:
            raise ValueError("high_ms must be >= low_ms")
        return self


class LognormalLatency(StrictModel):
    type: Literal["lognormal"] = "lognormal"
    median_ms: float = Field(50.0, gt=0)
    """Median one-way delay, in milliseconds."""
    sigma: float = Field(0.5, ge=0, le=3)
    """Spread of log(delay): 0.5 gives a long tail of occasional slow transmissions."""


Latency = Annotated[
    ConstantLatency | UniformLatency | LognormalLatency, Field(discriminator="type")
]


class NetworkSpec(StrictModel):
    topology: Literal["full", "mesh"] = "full"
    """`full`: every node linked to every other, messages travel one hop. `mesh`: each node
    linked to about `degree` random peers (a union of random rings, so connected);
    messages are relayed hop by hop and delivered once per node (GossipSub-like)."""
    degree: int = Field(6, ge=2, le=64)
    """Links per node on a `mesh` (GossipSub's D)."""
    max_hops: int = Field(0, ge=0, le=64)
    """On a `mesh`, how many hops a rollout batch travels (0: to every node). A bound keeps
    per-node traffic flat as the swarm grows; hellos always reach every node."""
    latency: Latency = ConstantLatency()
    """One-way delay per transmission: `constant`, `uniform` or `lognormal`."""
    bandwidth_mbps: float = Field(100.0, gt=0)
    """Each node's upload bandwidth (megabits/s); its transmissions queue behind each other."""
    loss: float = Field(0.0, ge=0, lt=1)
    """Probability that one transmission over one link is lost."""
    reorder: float = Field(0.0, ge=0, le=1)
    """Probability that one transmission is held back by `reorder_delay_ms` (later ones
    overtake it); random latency reorders too."""
    reorder_delay_ms: float = Field(200.0, ge=0)
    """Extra delay of a held-back transmission, in milliseconds."""
    max_message_bytes: int = Field(1 << 20, ge=1024)
    """Largest message a link carries whole; gossip chunks anything larger."""


# ---- faults ----------------------------------------------------------------------------


class PartitionFault(StrictModel):
    type: Literal["partition"] = "partition"
    start_s: float = Field(ge=0)
    """Virtual second at which the network splits."""
    end_s: float | None = None
    """Virtual second at which it heals (None: never)."""
    groups: list[list[str]] = Field(min_length=1)
    """Sides of the split, each a list of node names or node-group names; nodes not listed
    form one more side. Transmissions between sides are dropped while it lasts."""

    @model_validator(mode="after")
    def _heals_after_start(self) -> PartitionFault:
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError("end_s must be > start_s")
        return self


class LeaveFault(StrictModel):
    type: Literal["leave"] = "leave"
    node: str
    """Name of the node that leaves."""
    at_s: float = Field(ge=0)
    """Virtual second at which it leaves."""
    rejoin_s: float | None = None
    """Virtual second at which it comes back, resuming from its newest checkpoint
    (None: never)."""
    graceful: bool = False
    """True: it checkpoints before leaving (a clean stop). False: a crash; it resumes from
    its last periodic checkpoint and redoes the rounds since."""

    @model_validator(mode="after")
    def _rejoin_after_leave(self) -> LeaveFault:
        if self.rejoin_s is not None and self.rejoin_s <= self.at_s:
            raise ValueError("rejoin_s must be > at_s")
        return self


class ChurnFault(StrictModel):
    type: Literal["churn"] = "churn"
    fraction: float = Field(gt=0, le=1)
    """Share of the nodes (chosen by the run seed) that leave once each."""
    start_s: float = Field(0.0, ge=0)
    """Leaves happen at uniformly random times in [start_s, end_s)."""
    end_s: float = Field(gt=0)
    """End of the window in which nodes leave."""
    down_s: float | None = Field(60.0, gt=0)
    """How long each stays away before rejoining from its checkpoint (None: for good)."""
    graceful: bool = False
    """Checkpoint before leaving (True) or crash (False)."""

    @model_validator(mode="after")
    def _window(self) -> ChurnFault:
        if self.end_s <= self.start_s:
            raise ValueError("end_s must be > start_s")
        return self


Fault = Annotated[PartitionFault | LeaveFault | ChurnFault, Field(discriminator="type")]
