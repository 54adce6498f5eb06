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
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass

from rewards.mixture import Variants, register_variants
from rewards.registry import score_group
from rewards.tasks import UnusableSource, make_task
from swarm.config import RewardsConfig
from swarm.messages import RolloutGroup

log = logging.getLogger(__name__)
FORGED_REWARD_GAP = 0.5


class Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Rescored:
    rewards: tuple[float, ...]
    advisory_gap: float  # mean |advisory - local| reward; large gaps suggest forgery

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
    gap = statistics.fmean(abs(a - b) for a, b in zip(group.rewards, rewards, strict=True))
    if len(set(rewards)) <= 1:
        raise Refused("zero_variance")
    return Rescored(rewards, gap)
