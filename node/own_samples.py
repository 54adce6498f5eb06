"""A node's own rollouts for each round, sampled in the round or ahead of it.

Invariants:
- Round r's groups use the task stream's next `sapo.groups_sampled` (S) references and a seed
  distinct per node and round (`round_seed`), whether sampled in round r or ahead.
- Prefetch (always): once round r's policy is final (trained, peers' deltas merged), round
  r+1's groups are sampled while the node finishes round r (publish, checkpoint capture,
  metrics). Same weights, references and seed as sampling at the start of round r+1: only
  the model's idle time between rounds goes. Own-round sampling runs through `offload`
  (the node's model thread, in order with training: the node may queue it right behind
  round r's training).
- With overlap (`Learner.sample_overlap`, from `sampler.overlap`), round r+1's groups
  are sampled while round r trains (through `overlap_offload`, another thread): they come
  from the weights of one optimizer step earlier, and `SampleResult.policy_version` says
  which.
- At most one round is sampled ahead. `drain` (the node stopping) cancels it: sampling
  that has not started never does; sampling under way ends in its thread. Its groups are
  dropped either way (they were never trained on or shared).
- The task stream is advanced when the references are drawn, but `tasks_state` (what a
  checkpoint saves) leaves out the references of a round sampled ahead and not yet taken:
  a node resumed from that checkpoint samples the same tasks for that round again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from node.learner import Learner, SampleResult
from rewards.mixture import TaskStream
from swarm.config import NodeConfig


def round_seed(config: NodeConfig, round_index: int) -> int:
    """Distinct per node (task seed) even when nodes share one initial model."""
    return (config.model.seed * 1_000_003 + config.tasks.seed * 7_919 + round_index) & 0x7FFFFFFF


@dataclass
class _Ahead:
    round_index: int
    refs: int
    """How many task references it drew."""
    task: asyncio.Task[SampleResult]


class OwnSamples:
    def __init__(
        self,
        config: NodeConfig,
        tasks: TaskStream,
        learner: Callable[[], Learner],
        offload: Callable[..., Awaitable[Any]],
        overlap_offload: Callable[..., Awaitable[Any]] | None = None,
    ) -> None:
        self.config = config
        self.tasks = tasks
        self.learner = learner
        self.offload = offload
        self.overlap_offload = overlap_offload or offload
        self._ahead: _Ahead | None = None

    @property
    def overlap(self) -> bool:
        return bool(getattr(self.learner(), "sample_overlap", False))

    def _start(
        self, round_index: int, offload: Callable[..., Awaitable[Any]] | None = None
    ) -> Awaitable[SampleResult]:
        refs = self.tasks.next_refs(self.config.sapo.groups_sampled)
        seed = round_seed(self.config, round_index)
        return (offload or self.offload)(self.learner().sample, refs, seed)

    async def take(self, round_index: int) -> tuple[SampleResult, float]:
        """Round `round_index`'s own groups, and the seconds this waited for them."""
        waited_from = asyncio.get_running_loop().time()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.round_index == round_index:
            result = await ahead.task
        else:
            if ahead is not None:  # sampled for a round that is not coming: drop it
                await asyncio.wait({ahead.task})
            result = await self._start(round_index)
        return result, asyncio.get_running_loop().time() - waited_from

    def _sample_ahead(
        self, round_index: int, offload: Callable[..., Awaitable[Any]] | None = None
    ) -> None:
        if self._ahead is None:
            refs = self.config.sapo.groups_sampled
            task = asyncio.ensure_future(self._start(round_index, offload))
            self._ahead = _Ahead(round_index, refs, task)

    def sample_ahead(self, round_index: int) -> None:
        """With overlap on: start sampling round `round_index` now (while this one trains)."""
        if self.overlap:
            self._sample_ahead(round_index, self.overlap_offload)

    def prefetch(self, round_index: int) -> None:
        """Start (or, on an in-order model thread, queue) sampling round `round_index`:
        call once the policy it samples from is final, or queued behind the call that
        makes it final (a no-op where overlap already started it)."""
        self._sample_ahead(round_index)

    def tasks_state(self) -> dict[str, int]:
        """The task stream's checkpoint state, without a round sampled ahead and not taken."""
        state = self.tasks.state_dict()
        if self._ahead is not None:
            state["cursor"] -= self._ahead.refs
        return state

    async def drain(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.task.cancel()
            await asyncio.wait({ahead.task})
