"""Scenario files: a simulated swarm described in TOML, validated like node configs.

A scenario names node groups (count, model, per-group node-config overrides), the
network (topology, latency, bandwidth, loss, reordering), faults (partitions that start
and heal, nodes that leave and rejoin), rounds and seeds, and optionally *variants*:
the same swarm run with different node-config overrides (the SAPO I/J grid). The network
and fault models live in `simnet.scenario_network`.

Invariants:
- Every model forbids unknown keys and documents each field; `load_scenario` turns every
  failure (missing file, bad TOML, bad field, unknown node name, an override that makes
  an invalid node config) into one `ConfigError` naming the file and the field.
- Node-config overrides are checked by building every node's real `NodeConfig`
  (`node_config_data` + `swarm.config.parse_config`), so a scenario that loads yields
  valid nodes. The `node` and `transport` sections, `model.name_or_path`, `model.seed`,
  `tasks.seed` and `eval.seed` belong to simnet (names, data dirs, the memory network,
  seeds derived from the run seed: each node's held-out set derives from its own task
  seed) and may not be overridden.
- Nothing here imports simnet's engine, node/ or torch: the schema is plain data.
- Hostile peers: `NodeGroupSpec.behavior` is the switch: `honest`; `poison_deltas` (a
  learner in `simnet.hostile`); or one of `ATTACK_BEHAVIORS` (wire attackers in
  `simnet.attackers`, tuned by `NodeGroupSpec.hostile`; they never train).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, ValidationError, model_validator

from simnet.scenario_network import Fault, LeaveFault, NetworkSpec, PartitionFault
from swarm.config import TaskSpec, format_validation_error, parse_config
from swarm.config.base import StrictModel
from swarm.errors import ConfigError

NAME_PATTERN = r"^[A-Za-z0-9._-]+$"
OVERRIDABLE_SECTIONS = (
    "gossip",
    "model",
    "sampler",
    "train",
    "sapo",
    "tasks",
    "rewards",
    "deltas",
    "eval",
)
"""Node-config sections a scenario may override (the others belong to simnet)."""
_RESERVED_KEYS = {
    ("model", "name_or_path"),
    ("model", "seed"),
    ("tasks", "seed"),
    ("eval", "seed"),
}
SectionOverrides = dict[str, dict[str, Any]]


# ---- nodes -----------------------------------------------------------------------------


class WarmStartSpec(StrictModel):
    tasks: list[TaskSpec] = [TaskSpec(source="add")]
    """Task mixture the warm-up pairs are drawn from."""
    steps: int = Field(40, ge=1, le=100_000)
    """Supervised optimizer steps."""
    batch: int = Field(64, ge=1, le=4096)
    """(prompt, answer) pairs per step."""
    lr: float = Field(1e-3, gt=0, le=1)
    """AdamW learning rate of the warm-up."""
    answers: Literal["true", "shuffled"] = "true"
    """`true`: pairs with the right answers (a base that knows a little); `shuffled`: each
    prompt with an unrelated task's answer (a base that knows only the output format)."""


class ComputeSpec(StrictModel):
    sample_s_per_group: float = Field(1.0, ge=0)
    """Virtual seconds to sample (and score) one local group."""
    train_s_per_group: float = Field(0.5, ge=0)
    """Virtual seconds of training per group trained (local + external)."""
    round_overhead_s: float = Field(0.1, gt=0)
    """Fixed virtual seconds per round on top (optimizer step, bookkeeping); > 0, so every
    round moves virtual time forward."""
    jitter: float = Field(0.1, ge=0, lt=1)
    """Each duration is scaled by a uniform factor in [1 - jitter, 1 + jitter]."""


COMPETENCE_FIELDS = (
    "difficulty_mean",
    "difficulty_spread",
    "general_rate",
    "task_rate",
    "batch_exponent",
)
"""`StubSpec` fields used only by the `competence` rule."""


class StubSpec(StrictModel):
    rule: Literal["count", "competence"] = "count"
    """The stub's learning rule (`simnet.stub`). `count`: every informative group trained
    raises skill by the same amount, so sharing helps by construction (kept for the
    protocol benchmarks). `competence`: tasks have difficulties, the node a skill and
    per-task knowledge; a group teaches only what the node lacks on its task, so
    sharing can fail to help."""
    skill: float = Field(0.1, ge=0, le=1)
    """Initial probability that a stub completion is correct (`competence`: on a task of
    mean difficulty)."""
    rate: float = Field(0.02, ge=0, le=1)
    """`count`: skill gained toward 1 per informative group trained."""
    difficulty_mean: float = Field(0.0, ge=-20, le=20)
    """`competence`: mean task difficulty (logits)."""
    difficulty_spread: float = Field(2.0, ge=0, le=20)
    """`competence`: difficulties are uniform in `difficulty_mean` +- this."""
    general_rate: float = Field(0.05, ge=0, le=10)
    """`competence`: share of a step's gain added to the general skill logit."""
    task_rate: float = Field(0.5, ge=0, le=10)
    """`competence`: share of a group's gain added to its task's knowledge logit."""
    batch_exponent: float = Field(0.5, ge=0, le=1)
    """`competence`: a step's gains are divided by n ** this (n: groups with a gain);
    0 sums them (more groups, more learning), 1 averages them."""

    @model_validator(mode="after")
    def _fields_fit_rule(self) -> StubSpec:
        if self.rule == "count":
            defaults = type(self).model_fields
            found = [k for k in COMPETENCE_FIELDS if getattr(self, k) != defaults[k].default]
            if found:
                raise ValueError(
                    f"{', '.join(found)}: only used by rule = 'competence'; set "
                    'rule = "competence" or delete them'
                )
        return self


Behavior = Literal[
    "honest",
    "poison_deltas",
    "garbage",
    "wrong_swarm",
    "replay",
    "flood",
    "mismatched_prompt",
    "forged_rewards",
    "sybil",
    "silent_mid_chunk",
    "signal_bait",
    "signal_bait_ended",
    "signal_bait_farmed",
    "offpolicy_correct",
]
ATTACK_BEHAVIORS: tuple[str, ...] = tuple(
    b for b in get_args(Behavior) if b not in ("honest", "poison_deltas")
)
"""Behaviours of wire attackers (`simnet.attackers`): peers that send, never train."""
MANY_KEYS: tuple[str, ...] = (
    "sybil",
    "signal_bait",
    "signal_bait_ended",
    "signal_bait_farmed",
    "offpolicy_correct",
)
"""Attacks made with `hostile.sybil_keys` identities (the others use one)."""


class HostileSpec(StrictModel):
    every_s: float = Field(2.0, gt=0)
    """An attacker acts once per this many virtual seconds (its first time at random)."""
    flood_messages: int = Field(200, ge=1, le=100_000)
    """`flood`: signed messages sent per tick."""
    sybil_keys: int = Field(8, ge=1, le=4096)
    """`sybil`, `signal_bait`, `signal_bait_ended`: identities one attacker holds."""
    sybil_networks: int = Field(1, ge=1, le=4096)
    """Networks (address blocks) the attacker's keys are seen at, its keys dealt over
    them in turn: 1, one machine or subnet (what keys cost); up to `sybil_keys`, an
    address block rented per key (`sapo.networks_first`'s limit)."""
    groups_per_batch: int = Field(4, ge=1, le=256)
    """Rollout groups per batch the attacker sends (`forged_rewards`, `sybil`, ...)."""
    attack_after_s: float = Field(0.0, ge=0)
    """`signal_bait_farmed`: virtual seconds after it joined during which it re-sends
    honest peers' groups as its own (farming trust) before it sends bait."""


class NodeGroupSpec(StrictModel):
    name: str = Field("node", pattern=NAME_PATTERN, max_length=64)
    """Group name; its nodes are `<name>-<i>` (or just `<name>` when count is 1)."""
    count: int = Field(1, ge=1, le=100_000)
    """How many nodes in this group."""
    model: str = "stub"
    """`stub` (no torch: synthetic rollouts, toy learning rule, for protocol-scale runs) or
    a policy model for the real learner (`builtin:tiny`, `builtin:tiny-2x`, a hub id)."""
    init: Literal["per_node", "shared", "family"] = "per_node"
    """Model init seed: different per node; one per group and run seed (`shared`: the
    group's nodes start from the same random weights); or one per model and run seed
    (`family`: every `family` node of this model, in any group, starts from the same
    weights, so they form one model family and accept each other's weight deltas).
    Ignored for the weights when `warmstart` is set (then every node of a model starts
    from the same base), though the model family still follows the init seed."""
    stub: StubSpec = StubSpec()
    """Parameters of the stub learner (stub model only)."""
    compute: ComputeSpec | None = None
    """Virtual compute cost of this group's nodes (None: the scenario's `compute`)."""
    config: SectionOverrides = {}
    """Node-config sections for these nodes, over the scenario's and variant's `defaults`
    (e.g. `sapo = { local_groups = 6, external_groups = 2 }`)."""
    behavior: Behavior = "honest"
    """How these nodes behave. `honest`: the production learner. `poison_deltas` (real
    models only): a `simnet.hostile.PoisonLearner` that trains honestly but publishes
    every weight delta scaled by -1000 and never merges peers' (needs `deltas.enabled`
    to have any effect; give the group `init = "family"` so its packets are accepted).
    The others are wire attackers that never train (`simnet.attackers`): `garbage`,
    `wrong_swarm`, `replay`, `flood`, `mismatched_prompt`, `forged_rewards`, `sybil`,
    `silent_mid_chunk`; their `model` is ignored."""
    hostile: HostileSpec = HostileSpec()
    """How hard an attacker group attacks (attack behaviours only)."""
    join_s: float = Field(0.0, ge=0)
    """Virtual time at which these nodes come online (a late join: before it, they exist
    for nobody; then they start as a fresh node would, plus the start spread)."""
    rounds: int | None = Field(None, ge=1, le=1_000_000)
    """Rounds these nodes train (None: the scenario's `rounds`)."""

    @model_validator(mode="after")
    def _behavior_fits_model(self) -> NodeGroupSpec:
        if self.behavior == "poison_deltas" and self.model == "stub":
            raise ValueError("behavior 'poison_deltas' needs a real model, not 'stub'")
        return self

    @property
    def is_attacker(self) -> bool:
        return self.behavior in ATTACK_BEHAVIORS

    def node_names(self) -> list[str]:
        if self.count == 1:
            return [self.name]
        return [f"{self.name}-{i}" for i in range(self.count)]


class VariantSpec(StrictModel):
    name: str = Field(pattern=NAME_PATTERN, max_length=64)
    """Directory-safe name of this configuration (e.g. `i4-j4`)."""
    label: str | None = None
    """Display name in reports (e.g. `4/4`); defaults to `name`."""
    defaults: SectionOverrides = {}
    """Node-config sections for every node in this variant, over the scenario's."""

    @property
    def display(self) -> str:
        return self.label or self.name


class Scenario(StrictModel):
    name: str = Field(pattern=NAME_PATTERN, max_length=64)
    """Scenario name (also the swarm id of its nodes)."""
    description: str = ""
    """Free text shown in reports."""
    rounds: int = Field(ge=1, le=1_000_000)
    """Rounds each node trains (a node that crashed redoes the rounds it lost)."""
    seeds: list[int] = Field([0], min_length=1)
    """One run per seed (and per variant); a seed fixes every random choice of a run."""
    defaults: SectionOverrides = {}
    """Node-config sections for every node (`sapo`, `sampler`, `train`, `tasks`, ...)."""
    compute: ComputeSpec = ComputeSpec()
    """Virtual compute cost of a node, unless its group sets one."""
    nodes: list[NodeGroupSpec] = Field(min_length=1)
    """Node groups, heterogeneous if they differ."""
    network: NetworkSpec = NetworkSpec()
    """The link model."""
    faults: list[Fault] = []
    """Partitions, leaves (crash or clean) and random churn, on a virtual-time schedule."""
    variants: list[VariantSpec] = []
    """Configurations to compare (each runs every seed); none: one run per seed."""
    checkpoint_every: int = Field(10, ge=0)
    """Each node checkpoints every this many rounds (0: never, for protocol-scale runs)."""
    announce_every_s: float = Field(0.0, ge=0)
    """Each node publishes a hello this often, in virtual seconds (0: never)."""
    start_spread_s: float = Field(1.0, ge=0)
    """Nodes start their first round at random times in [0, start_spread_s)."""
    share_pure_work: bool = False
    """Simulator speed-up for protocol-scale runs: decode, verify and re-score each message
    once for all its receivers (pure functions, so metrics are identical; see
    `simnet.shared`)."""
    warmstart: WarmStartSpec | None = None
    """A shared base model for real-model nodes: every node of a model starts from the same
    short supervised warm-up (see `simnet.base_model`) instead of random weights. Needs
    `train.beta = 0` and deltas off."""
    torch_threads: int = Field(1, ge=1, le=256)
    """torch intra-op threads for real models (1 keeps runs deterministic and cheap)."""

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be unique")
        groups = [g.name for g in self.nodes]
        if len(set(groups)) != len(groups):
            raise ValueError("node group names must be unique")
        names = self.node_names()
        if len(set(names)) != len(names):
            raise ValueError("node names clash (a group name equals another's node name)")
        variants = [v.name for v in self.variants]
        if len(set(variants)) != len(variants):
            raise ValueError("variant names must be unique")
        known = set(names) | set(groups)
        for fault in self.faults:
            if isinstance(fault, LeaveFault) and fault.node not in names:
                raise ValueError(f"leave fault: unknown node {fault.node!r}")
            if isinstance(fault, PartitionFault):
                for side in fault.groups:
                    for item in side:
                        if item not in known:
                            raise ValueError(f"partition fault: unknown node or group {item!r}")
        for where, overrides in self._all_overrides():
            _check_overrides(where, overrides)
        return self

    def _all_overrides(self) -> list[tuple[str, SectionOverrides]]:
        found = [("defaults", self.defaults)]
        found += [(f"variants.{v.name}.defaults", v.defaults) for v in self.variants]
        found += [(f"nodes.{g.name}.config", g.config) for g in self.nodes]
        return found

    def node_names(self) -> list[str]:
        return [name for group in self.nodes for name in group.node_names()]

    def variant_list(self) -> list[VariantSpec | None]:
        """The variants to run; `[None]` for a scenario without variants."""
        return list(self.variants) if self.variants else [None]

    def group_members(self, item: str) -> list[str]:
        """Node names meant by a node or node-group name."""
        for group in self.nodes:
            if group.name == item:
                return group.node_names()
        return [item]


def _check_overrides(where: str, overrides: SectionOverrides) -> None:
    for section, values in overrides.items():
        if section not in OVERRIDABLE_SECTIONS:
            raise ValueError(
                f"{where}: section {section!r} cannot be set here "
                f"(allowed: {', '.join(OVERRIDABLE_SECTIONS)})"
            )
        if not isinstance(values, dict):
            raise ValueError(f"{where}.{section} must be a table")
        for key in values:
            if (section, key) in _RESERVED_KEYS:
                raise ValueError(
                    f"{where}.{section}.{key} is set by simnet (the node group's `model`, "
                    "or seeds derived from the run seed)"
                )


def merge_sections(*layers: SectionOverrides) -> dict[str, dict[str, Any]]:
    """Section-wise merge: later layers override keys of earlier ones."""
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in layer.items():
            merged.setdefault(section, {}).update(values)
    return merged


def node_config_data(
    scenario: Scenario,
    variant: VariantSpec | None,
    group: NodeGroupSpec,
    *,
    name: str,
    data_dir: Path,
    model_seed: int,
    tasks_seed: int,
) -> dict[str, Any]:
    """The node-config dict of one node (validate it with `swarm.config.parse_config`)."""
    data: dict[str, Any] = merge_sections(
        scenario.defaults, variant.defaults if variant else {}, group.config
    )
    data["node"] = {
        "name": name,
        "swarm_id": scenario.name,
        "data_dir": str(data_dir),
        "checkpoint_every": scenario.checkpoint_every or 1_000_000_000,
    }
    data["transport"] = {
        "type": "memory",
        "network": scenario.name,
        "max_message_bytes": scenario.network.max_message_bytes,
    }
    model = data.setdefault("model", {})
    model["seed"] = model_seed
    if group.model != "stub":
        model["name_or_path"] = group.model
        model.setdefault("device", "cpu")
    data.setdefault("tasks", {})["seed"] = tasks_seed
    return data


def _check_node_configs(scenario: Scenario, source: str) -> None:
    """Build one node config per (variant, group) so bad overrides fail at load."""
    for variant in scenario.variant_list():
        for group in scenario.nodes:
            data = node_config_data(
                scenario,
                variant,
                group,
                name=group.name,
                data_dir=Path("."),
                model_seed=0,
                tasks_seed=0,
            )
            where = f"{source} (nodes {group.name!r}"
            where += f", variant {variant.name!r})" if variant else ")"
            config = parse_config(data, where)
            if scenario.warmstart is not None and group.model != "stub":
                if config.train.beta > 0 or config.deltas.enabled:
                    raise ConfigError(
                        f"{where}: warmstart needs train.beta = 0 and deltas off (the "
                        "learner snapshots its initial weights when it is built)"
                    )


def parse_scenario(data: dict[str, Any], source: str = "<scenario>") -> Scenario:
    """Validate a scenario dict; `ConfigError` naming the field on any problem."""
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None
    _check_node_configs(scenario, source)
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario TOML file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: scenario file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read scenario: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_scenario(data, str(path))
