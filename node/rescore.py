"""Re-scoring a peer's rollout group from the task reference alone.

Invariants:
- The question and ground truth are regenerated locally from (source, seed, index);
  the peer's prompt must equal the regenerated one, and the peer's rewards are only
  compared, never used.
- A group is refused with a reason: `unknown_task` (source/index not known here, or a
  source the measured table `swarm.config.task_sources` refuses), `nondeterministic_task`
  (a source whose generator may differ between processes: our own generator could make
  an honest peer's prompt mismatch, so this is never the peer's fault),
  `task_error` (the generator failed on the peer's reference: any exception, since a
  peer must not crash the node through a dataset's bug), `prompt_mismatch` (the peer
  claims a different question), `zero_variance` (all completions score the same: no
  GRPO signal; not the peer's fault).
- The peer's claimed rewards are never used (the group trains on the rewards computed
  here), only judged: `Rescored.forged` holds where no valid `[rewards]` settings explain
  them, i.e. where the mean gap between the claims and the rewards under our correctness
  reward and every other one of `rewards.registry.CORRECTNESS` that is quick for the
  task's source (`quick_correctness`), both answer formats and every format weight in
  [0, 1] exceeds `FORGED_REWARD_GAP` (`settings_gap`). A peer whose
  claims differ from ours only because its settings differ is never blamed (issue 31:
  `format_weight = 1.0` or a `closeness` reward was refused as `forged_rewards`).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass

from rewards.mixture import Variants, register_variants
from rewards.registry import CORRECTNESS, correctness, format_reward, score_group
from rewards.tasks import Task, UnusableSource, get_source, make_task
from swarm.config import RewardsConfig
from swarm.messages import RolloutGroup

log = logging.getLogger(__name__)
FORGED_REWARD_GAP = 0.5
"""Mean |claimed - recomputed| reward per completion, under the settings that explain the
claims best, above which a group's claims are forged (rewards lie in [0, 2]). Lenient so
that a sender whose scorer timed out on a completion or two is not blamed."""
ANSWER_FORMATS = ("first_line", "answer_block")
BUILTIN_CORRECTNESS = ("exact", "numeric", "closeness", "source")


class Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Rescored:
    rewards: tuple[float, ...]
    advisory_gap: float
    """Mean |claimed - recomputed| reward under the settings that explain the claims best
    (ours where they are within `FORGED_REWARD_GAP`)."""

    @property
    def forged(self) -> bool:
        return self.advisory_gap > FORGED_REWARD_GAP


def rescore_group(group: RolloutGroup, config: RewardsConfig, variants: Variants = ()) -> Rescored:
    """The group's local rewards, or `Refused`. `variants`: the node's reasoning-gym
    dataset variants (`rewards.mixture.variants`), served here too (a worker process)."""
    register_variants(variants)
    try:
        task = make_task(group.task)
    except UnusableSource as unusable:
        raise Refused(unusable.reason) from None
    except (KeyError, ValueError):
        raise Refused("unknown_task") from None
    except Exception as exc:  # noqa: BLE001 - a dataset bug on a peer-chosen reference
        log.info("task %s failed to generate: %r", group.task, exc)
        raise Refused("task_error") from None
    if task.prompt != group.prompt:
        raise Refused("prompt_mismatch")
    rewards = tuple(score_group(task, list(group.completions), config))
    if len(set(rewards)) <= 1:
        raise Refused("zero_variance")
    gap = mean_gap(group.rewards, rewards)
    if gap > FORGED_REWARD_GAP:  # other settings than ours, or a lie: see the docstring
        gap = min(gap, _gap_under_any_settings(task, group, config, rewards))
    return Rescored(rewards, gap)


def mean_gap(claimed: tuple[float, ...], rewards: tuple[float, ...] | list[float]) -> float:
    """Mean |claimed - reward| per completion."""
    return statistics.fmean(abs(a - b) for a, b in zip(claimed, rewards, strict=True))


def settings_gap(
    claimed: tuple[float, ...], correct: list[float], well_formed: list[float]
) -> float:
    """The smallest `mean_gap` between `claimed` and `correct + w * well_formed` over
    format weights w in [0, 1] (one correctness reward and one answer format). The gap
    is convex and piecewise linear in w, so its minimum lies at 0, 1 or a point where one
    completion's gap is zero."""
    candidates = {0.0, 1.0}
    for claim, c, f in zip(claimed, correct, well_formed, strict=True):
        if f > 0:
            candidates.add(min(1.0, max(0.0, (claim - c) / f)))
    return min(
        mean_gap(claimed, [c + w * f for c, f in zip(correct, well_formed, strict=True)])
        for w in candidates
    )


def quick_correctness(source: str, ours: str) -> list[str]:
    """The other correctness rewards tried when explaining a peer's claims: the built-in
    ones that run inline for `source`. A slow one (e.g. reasoning-gym's own scorer) runs
    in a sandboxed process per completion: trying it for every suspicious group would let
    a forger multiply what re-scoring costs us. A reward registered at run time is not
    tried: it may exist in one process and not in another, and a worker process must
    judge a group as this one does. Ours is known already (`rescore_group`)."""
    slow_source = get_source(source).slow_scoring
    return [
        name
        for name in BUILTIN_CORRECTNESS
        if name != ours
        and not (slow_source if CORRECTNESS[name].slow is None else CORRECTNESS[name].slow)
    ]


def _gap_under_any_settings(
    task: Task, group: RolloutGroup, config: RewardsConfig, rewards: tuple[float, ...]
) -> float:
    """`settings_gap` minimized over our correctness reward (recovered from `rewards`,
    our scores: no second pass), the `quick_correctness` ones and both answer formats."""
    completions = list(group.completions)
    formats = [[format_reward(task, c, kind) for c in completions] for kind in ANSWER_FORMATS]
    ours = list(rewards)
    if config.format_weight > 0:  # as `rewards.registry.score` adds it
        ours = [
            r - config.format_weight * format_reward(task, c, config.answer_format)
            for r, c in zip(rewards, completions, strict=True)
        ]
    candidates = [ours]
    for name in quick_correctness(task.ref.source, config.correctness):
        other = config.model_copy(update={"correctness": name})
        candidates.append([correctness(task, c, other) for c in completions])
    best = float("inf")
    for correct in candidates:
        for well_formed in formats:
            best = min(best, settings_gap(group.rewards, correct, well_formed))
            if best <= FORGED_REWARD_GAP:
                return best
    return best
