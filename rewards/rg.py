"""Reasoning-gym adapter: sources named `rg:<dataset>` with the dataset's own scorer.

Invariants:
- A reference (seed, index) maps to dataset seed `blake2b("swarm-rg:<name>:<seed>")`
  (31 bits) and item `index`. reasoning-gym seeds item i with `dataset_seed + i`, so raw
  seeds 0 and 1 would give overlapping streams; hashing the seed keeps node streams apart.
- Only datasets the checked-in table `swarm.config.task_sources` marks usable are served
  (`get_rg_source`); the rest raise `UnusableSource` (a `KeyError`) whose `reason` is
  `nondeterministic_task` (our own generator may differ from the peer's: not the peer's
  fault), `task_error` (broken on every reference) or `unknown_task` (`REFUSAL_REASONS`).
  The table is measured by `benchmarks/task_sources.py`, never probed at run time.
- How a usable dataset is built is fixed by the table, per dataset:
  `lazy` datasets generate items on demand and are built once per seed at size `RG_SIZE`
  (exactly as before the table existed); `sized` datasets precompute their items in the
  constructor (a size of 2**31-1 never returns), so item `index` is item `index` of a
  dataset built at size `index + 1`, and indices are capped (`RG_SIZED`) so that one
  build stays bounded in time.
- Indices are bounded by the source's `max_index` (checked before anything is built).
- Correctness is `dataset.score_answer(answer, entry)` on the regenerated entry, clamped
  to [0, 1] (NaN -> 0); it may be slow, so the registry runs it under a time limit.
- Dataset options (`[[tasks.mixture]] options`, e.g. the SAPO paper's settings) are part of
  a source's name: `rg:<dataset>@<digest>`, the digest a blake2b of the canonical JSON of
  the options (`variant_name`). A node serves only the variants it registered from its
  own mixture (`register_variant`; re-scoring workers get the same list), so a peer's
  group made with other options is refused as `unknown_task` (counted, not blamed),
  never regenerated with the wrong options. Without options the name is `rg:<dataset>`
  and the dataset's defaults are used, exactly as before options existed.
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import lru_cache
from typing import Any, Literal

from rewards.tasks import RG_PREFIX, Task, UnusableSource, _check_range
from swarm.config.task_sources import RG_LAZY, RG_MAX_INDEX, RG_SIZED, rg_refusal
from swarm.messages import TaskRef

RG_SIZE = 2**31 - 1
"""Size every `lazy` dataset is built with (items are generated on demand, so it costs
nothing); `RG_MAX_INDEX` (`RG_SIZE - 1`) is their largest index."""

assert RG_MAX_INDEX == RG_SIZE - 1

ANSWER_INSTRUCTION = "\nGive only the final answer, between <answer> and </answer>.\n"
"""Appended to every reasoning-gym question so answers can be extracted."""

BuildRule = Literal["lazy", "sized"]

REFUSAL_REASONS: dict[str, str] = {
    "nondeterministic": "nondeterministic_task",  # our generator's fault, not the peer's
    "broken": "task_error",  # fails on every reference: what generating it would say
}
"""The refusal reason for a peer's group of a refused dataset, by the table's kind;
other kinds (`slow`, `hang`, `unmeasured`) are `unknown_task`: not served here."""


def dataset_names() -> list[str]:
    """Every dataset name the installed reasoning-gym registers (usable or not)."""
    import reasoning_gym.factory as factory

    return sorted(factory.DATASETS)


def usable_dataset_names() -> list[str]:
    """The datasets `get_rg_source` serves: the table's usable ones that are installed."""
    return [n for n in dataset_names() if n in RG_LAZY or n in RG_SIZED]


def build_rule(dataset: str) -> BuildRule:
    """How the table says `dataset` is built (`lazy` for datasets not in `RG_SIZED`)."""
    return "sized" if dataset in RG_SIZED else "lazy"


def _dataset_seed(name: str, seed: int) -> int:
    digest = hashlib.blake2b(f"swarm-rg:{name}:{seed}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") >> 1


def _build(name: str, seed: int, size: int, opts: str = "") -> Any:
    import reasoning_gym

    options = json.loads(opts) if opts else {}
    return reasoning_gym.create_dataset(name, seed=_dataset_seed(name, seed), size=size, **options)


@lru_cache(maxsize=64)
def _lazy_dataset(name: str, seed: int, opts: str = "") -> Any:
    return _build(name, seed, RG_SIZE, opts)


@lru_cache(maxsize=8)
def _sized_dataset(name: str, seed: int, index: int, opts: str = "") -> Any:
    return _build(name, seed, index + 1, opts)


def dataset_for(name: str, seed: int, index: int, rule: BuildRule, opts: str = "") -> Any:
    """The dataset object that holds item `index` of reference (seed, index) under `rule`
    (`opts`: the variant's canonical options JSON, "" for the defaults)."""
    if rule == "lazy":
        return _lazy_dataset(name, seed, opts)
    return _sized_dataset(name, seed, index, opts)


def canonical_options(options: dict[str, Any]) -> str:
    """The options as canonical JSON ("" for none): equal options, equal text."""
    return json.dumps(options, sort_keys=True, separators=(",", ":")) if options else ""


def variant_name(dataset: str, options: dict[str, Any]) -> str:
    """The source name of `dataset` with `options` (`rg:<dataset>` without options)."""
    opts = canonical_options(options)
    if not opts:
        return RG_PREFIX + dataset
    digest = hashlib.blake2b(opts.encode(), digest_size=6).hexdigest()
    return f"{RG_PREFIX}{dataset}@{digest}"


_VARIANTS: dict[str, tuple[str, str]] = {}
"""Registered variants: source name -> (dataset, canonical options)."""


def register_variant(dataset: str, options: dict[str, Any]) -> str:
    """Serve `dataset` with `options` under its variant name (returned); idempotent."""
    name = variant_name(dataset, options)
    if options:
        _VARIANTS[name] = (dataset, canonical_options(options))
    return name


def raw_entry(name: str, seed: int, index: int, rule: BuildRule) -> dict[str, Any]:
    """Item `index` for reference (seed, index) built under `rule`, ignoring the table and
    the index bound (for `benchmarks/task_sources.py`, which measures the table)."""
    if rule == "lazy":
        return _build(name, seed, RG_SIZE)[index]
    return _build(name, seed, index + 1)[index]


@lru_cache(maxsize=4096)
def _entry(name: str, seed: int, index: int, opts: str = "") -> dict[str, Any]:
    return dataset_for(name, seed, index, build_rule(name), opts)[index]


class RgSource:
    """One usable reasoning-gym dataset as a `TaskSource`."""

    answer_pattern = r"(?s).*"  # any content, even empty: `ab` has empty answers
    needs_answer_block = True  # the question asks for the block (ANSWER_INSTRUCTION)
    slow_scoring = True

    def __init__(self, dataset: str, opts: str = "") -> None:
        self.dataset = dataset
        self.opts = opts
        self.name = variant_name(dataset, json.loads(opts) if opts else {})
        self.max_index = RG_SIZED.get(dataset, RG_MAX_INDEX)

    def make(self, seed: int, index: int) -> Task:
        _check_range(seed, index, self.max_index)
        entry = _entry(self.dataset, seed, index, self.opts)
        return Task(
            TaskRef(self.name, seed, index),
            str(entry["question"]) + ANSWER_INSTRUCTION,
            str(entry["answer"]),
        )

    def score_answer(self, task: Task, answer: str) -> float:
        seed, index = task.ref.seed, task.ref.index
        entry = _entry(self.dataset, seed, index, self.opts)
        dataset = dataset_for(self.dataset, seed, index, build_rule(self.dataset), self.opts)
        value = float(dataset.score_answer(answer, entry))
        return 0.0 if math.isnan(value) else min(1.0, max(0.0, value))

    def __repr__(self) -> str:
        return f"RgSource({self.name!r})"


def get_rg_source(dataset: str) -> RgSource:
    """The adapter for one usable dataset (or a registered `<dataset>@<digest>` variant);
    `UnusableSource` (a `KeyError`) otherwise."""
    if "@" in dataset:
        variant = _VARIANTS.get(RG_PREFIX + dataset)
        if variant is None:
            raise UnusableSource(
                "unknown_task",
                f"{RG_PREFIX}{dataset}: a dataset variant (options) this node does not use",
            )
        base = _default_source(variant[0])
        return _variant_source(base.dataset, variant[1])
    return _default_source(dataset)


@lru_cache(maxsize=256)
def _variant_source(dataset: str, opts: str) -> RgSource:
    return RgSource(dataset, opts)


@lru_cache(maxsize=256)
def _default_source(dataset: str) -> RgSource:
    names = dataset_names()
    if dataset not in names:
        raise UnusableSource(
            "unknown_task",
            f"unknown reasoning-gym dataset {dataset!r}; known: {', '.join(names)}",
        )
    refusal = rg_refusal(dataset)
    if refusal is not None:
        kind, message = refusal
        reason = REFUSAL_REASONS.get(kind, "unknown_task")
        raise UnusableSource(reason, f"{RG_PREFIX}{dataset} is refused: {message}")
    return RgSource(dataset)
