"""A node's own rollouts for each round, sampled in the round or ahead of it.

Invariants:
- Round r's groups use the task stream's next `sapo.groups_sampled` (S) references and a seed
  distinct per node and round (`round_seed`), whether sampled in round r or ahead.
- With overlap (`Learner.sample_overlap`, from `sampler.overlap`), round r+1's groups
  are sampled (in a worker thread) while round r trains: they come from the weights of
  one optimizer step earlier, and `SampleResult.policy_version` says which. At most one
  round is sampled ahead, and `drain` waits for it when the node stops (its groups are
  then dropped: they were never trained on or shared).
- The task stream is advanced when the references are drawn: a checkpoint taken while
  round r+1 is being sampled ahead resumes after those references (a restarted node
  samples different tasks than it would have, never the same twice).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from node.learner import Learner, SampleResult
from rewards.mixture import TaskStream
from swarm.config import NodeConfig


def round_seed(config: NodeConfig, round_index: int) -> int:
    """Distinct per node (task seed) even when nodes share one initial model."""
    return (config.model.seed * 1_000_003 + config.tasks.seed * 7_919 + round_index) & 0x7FFFFFFF


class OwnSamples:
    def __init__(
        self,
        config: NodeConfig,
        tasks: TaskStream,
        learner: Callable[[], Learner],
        offload: Callable[..., Awaitable[Any]],
    ) -> None:
        self.config = config
        self.tasks = tasks
        self.learner = learner
        self.offload = offload
        self._ahead: tuple[int, asyncio.Task[SampleResult]] | None = None

    @property
    def overlap(self) -> bool:
        return bool(getattr(self.learner(), "sample_overlap", False))

    def _start(self, round_index: int) -> Awaitable[SampleResult]:
        refs = self.tasks.next_refs(self.config.sapo.groups_sampled)
        seed = round_seed(self.config, round_index)
        return self.offload(self.learner().sample, refs, seed)

    async def take(self, round_index: int) -> tuple[SampleResult, float]:
        """Round `round_index`'s own groups, and the seconds this waited for them."""
        waited_from = asyncio.get_running_loop().time()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == round_index:
            result = await ahead[1]
        else:
            if ahead is not None:  # sampled for a round that is not coming: drop it
                await asyncio.wait({ahead[1]})
            result = await self._start(round_index)
        return result, asyncio.get_running_loop().time() - waited_from

    def sample_ahead(self, round_index: int) -> None:
        """With overlap on: start sampling round `round_index` now (while this one trains)."""
        if self.overlap and self._ahead is None:
            task = asyncio.ensure_future(self._start(round_index))
            self._ahead = (round_index, task)

    async def drain(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            await asyncio.wait({ahead[1]})
