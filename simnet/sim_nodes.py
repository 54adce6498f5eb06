"""The pieces a simulation is made of: seed derivation, each node's config and address
block, modeled compute time, node plans.

Invariants: every seed derives from the run seed and names (`derive`), never from global
RNG state; `TimedLearner` reports modeled virtual durations, never wall time, so metrics
stay deterministic.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.learner import (
    EvalResult,
    ExternalGroup,
    Learner,
    LocalGroup,
    SampleResult,
    TrainResult,
)
from node.metrics import MetricsWriter
from node.runner import Node
from simnet.attackers import Attacker
from simnet.scenario import (
    ComputeSpec,
    NodeGroupSpec,
    Scenario,
    VariantSpec,
    WarmStartSpec,
    node_config_data,
)
from simnet.stub import StubLearner, competence_of
from swarm.config import NodeConfig, parse_config
from swarm.identity import Identity
from swarm.messages import DeltaPacket, TaskRef

YOUNG_GC_THRESHOLD = 200_000
"""A run makes almost no cyclic garbage (a full collection after 300 stub nodes x 20
rounds run with the collector off found 33 objects), but each young-generation pass
walks every object allocated since the last one that is still alive, so passes cost in
proportion to the live state: in 1,000 stub nodes x 15 rounds, 50,000 spent 1.7 s of
about 25 s CPU in the collector, 200,000 spent 0.6 s."""


@contextmanager
def fewer_young_gc_passes() -> Iterator[None]:
    """Raise the youngest GC generation's threshold while a run goes (it allocates many
    short-lived objects, almost none in cycles); restored afterwards."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], YOUNG_GC_THRESHOLD), old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def derive(seed: int, *parts: object) -> int:
    """A 31-bit seed derived from the run seed and a label (stable across platforms)."""
    text = ":".join(str(p) for p in ("simnet", seed, *parts))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (2**31)


def derive_bytes(seed: int, *parts: object) -> bytes:
    text = ":".join(str(p) for p in ("simnet-key", seed, *parts))
    return hashlib.blake2b(text.encode(), digest_size=32).digest()


@dataclass(frozen=True)
class Progress:
    """What `run_scenario` reports as it goes."""

    run: str
    """`<variant>/seed-<n>` (or `seed-<n>`)."""
    run_index: int
    runs_total: int
    node_rounds_done: int
    node_rounds_total: int
    virtual_s: float
    finished: bool = False
    summary: dict[str, Any] | None = None
    """The run summary, once `finished`."""


ProgressFn = Callable[[Progress], None]


def _is_wall_time(key: str) -> bool:
    return (
        key in ("seconds", "time")
        or key.startswith("time_")
        or key.endswith(("_s", "_seconds", "_time"))
    )


class TimedLearner:
    """A `Learner` wrapper that reports modeled virtual durations instead of measured ones.

    Sampling takes `sample_s_per_group` per local group; training takes
    `train_s_per_group` per group trained plus `round_overhead_s`; each scaled by a
    jitter factor from the node's own seeded RNG. Measured wall times in the training
    stats (keys named like `seconds`, `time_*`, `*_s`) would break determinism: `seconds`
    becomes the modeled training time, the others None.
    """

    def __init__(self, inner: Learner, compute: ComputeSpec, rng: random.Random) -> None:
        self.inner = inner
        self.compute = compute
        self.rng = rng
        self.model_id = inner.model_id
        self.model_family = inner.model_family
        # With `sampler.overlap`, round r+1's modeled sampling runs beside round r's
        # modeled training (virtual timers run at once): the round takes the longer one.
        self.sample_overlap = bool(getattr(inner, "sample_overlap", False))

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    def _factor(self) -> float:
        jitter = self.compute.jitter
        return self.rng.uniform(1 - jitter, 1 + jitter) if jitter else 1.0

    def sample(self, refs: list[TaskRef], seed: int) -> SampleResult:
        result = self.inner.sample(refs, seed)
        seconds = len(refs) * self.compute.sample_s_per_group * self._factor()
        return SampleResult(result.groups, seconds, 0.0, result.policy_version, result.skipped)

    def train(self, local: list[LocalGroup], external: list[ExternalGroup]) -> TrainResult:
        result = self.inner.train(local, external)
        groups = len(local) + len(external)
        seconds = groups * self.compute.train_s_per_group + self.compute.round_overhead_s
        seconds *= self._factor()
        stats = {
            key: (round(seconds, 4) if key == "seconds" else None) if _is_wall_time(key) else v
            for key, v in result.stats.items()
        }
        return TrainResult(stats, seconds)

    def evaluate(self, refs: list[TaskRef], max_new_tokens: int, samples: int = 0) -> EvalResult:
        result = self.inner.evaluate(refs, max_new_tokens, samples)
        result.seconds = 0.0  # measured wall time would break determinism
        return result

    def receive_delta(
        self, sender: str, sender_version: int, packet: DeltaPacket, arrival_round: int
    ) -> None:
        self.inner.receive_delta(sender, sender_version, packet, arrival_round)

    def share_deltas(self, own_round: int) -> tuple[DeltaPacket | None, dict[str, Any] | None]:
        return self.inner.share_deltas(own_round)

    def save(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.inner.save(directory, manifest)

    def capture(self, directory: Path, manifest: dict[str, Any]) -> Callable[[], None]:
        return self.inner.capture(directory, manifest)

    def load(self, directory: Path) -> dict[str, Any]:
        return self.inner.load(directory)


@dataclass
class NodePlan:
    """One node of a run, resolved from the scenario."""

    index: int
    name: str
    group: NodeGroupSpec
    config: NodeConfig
    compute: ComputeSpec
    identity: Identity


def make_learner(plan: NodePlan, warmstart: WarmStartSpec | None, run_seed: int) -> Learner:
    """The node's learner: the stub for `model = "stub"`, else a real `PolicyLearner`
    (`PoisonLearner` for the `poison_deltas` behavior), warm-started when the scenario
    says so (every node of a model from the same base, derived from the run seed)."""
    config = plan.config
    if plan.group.model == "stub":
        return StubLearner(
            config.sampler.group_size,
            config.rewards,
            plan.group.stub.skill,
            plan.group.stub.rate,
            competence=competence_of(plan.group.stub),
        )
    from node.policy_learner import PolicyLearner  # torch: only for real models

    if plan.group.behavior == "poison_deltas":
        from simnet.hostile import PoisonLearner

        learner: PolicyLearner = PoisonLearner(config)
    else:
        learner = PolicyLearner(config)
    if warmstart is not None:
        from simnet.base_model import apply_base, base_state

        seed = derive(run_seed, "base", plan.group.model)
        apply_base(learner, base_state(plan.group.model, seed, warmstart))
    return learner


@dataclass
class SimNode:
    """A node's life in the simulation, across incarnations (leave and rejoin)."""

    plan: NodePlan
    node: Node | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    writer: MetricsWriter | None = None
    incarnation: int = 0
    online: bool = False
    finished: bool = False
    gone: bool = False
    leaving: bool = False
    rejoin_at: float | None = None
    rewards: dict[int, float | None] = field(default_factory=dict)
    external: dict[int, int] = field(default_factory=dict)
    resumed_from: list[int] = field(default_factory=list)
    attacker: Attacker | None = None
    """A wire attacker's state (`simnet.attackers`); None for nodes that run a `Node`."""


def sim_network(index: int, block: int = 0) -> str:
    """The address block simnet node `index` is seen at (`Transport.peer_network`);
    `block` > 0: another block of the same attacker (`hostile.sybil_networks`)."""
    return f"sim-{index}" if block == 0 else f"sim-{index}.{block}"


def node_seeds(seed: int, group: NodeGroupSpec, name: str) -> tuple[int, int]:
    """The model and task seeds of node `name` of `group` in a run of seed `seed`."""
    init_key = {"shared": group.name, "family": "family"}.get(group.init, name)
    return derive(seed, "model", group.model, init_key), derive(seed, "tasks", name)


def node_config(
    scenario: Scenario,
    variant: VariantSpec | None,
    group: NodeGroupSpec,
    name: str,
    seed: int,
    data_dir: Path,
) -> NodeConfig:
    """The config node `name` of `group` runs with in a run of seed `seed` (its held-out
    sets derive from it: `benchmarks/constant_answers.py` rebuilds them so)."""
    model_seed, tasks_seed = node_seeds(seed, group, name)
    data = node_config_data(
        scenario,
        variant,
        group,
        name=name,
        data_dir=data_dir,
        model_seed=model_seed,
        tasks_seed=tasks_seed,
    )
    return parse_config(data, f"{scenario.name}: node {name}")
