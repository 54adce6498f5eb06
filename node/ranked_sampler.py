"""A node's sampler on every training rank (`sampler.data_parallel`): each rank samples a
share of the prompts on its own device, rank 0 gathers them (issue 36).

Invariants:
- The caller sees one sampler: `RankedSampler.generate` on rank 0 returns every prompt's
  completions in prompt order. It splits the prompts into contiguous shares
  (`prompt_shares`: sizes differ by at most one, the earlier ones larger), one per
  sampler: a rank, or with vLLM tensor parallelism across ranks (`ranks_per_share` > 1)
  a group of consecutive ranks that samples one share together. Rank 0 broadcasts the
  `sample` command with every share, samples its own, and gathers the others'
  (`gather_object`).
- Share k is sampled with `share_seed(seed, k)` (no seed: each rank's own stream), so a
  seeded call is reproducible for a given number of ranks; greedy decoding gives the
  completions one sampler would.
- Every rank's sampler holds the weights of the same policy version: the other ranks
  refresh theirs (`SamplerReplica.refresh`) in every command that changes the weights
  (a step, a merge's sync, a resume's load), rank 0 through the node's own sync.
- vLLM on several ranks builds its engines over the node's process group (vLLM's
  "external launcher" mode: `launcher_env` names this process's rank for it): building
  them is a collective of every rank, so every rank builds one, at the same point.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from node.ranks import Command, TrainingRanks
from policy.sampler import Completion, Prompt, Sampler, SamplingParams

SharePayload = tuple[list[Prompt], int, SamplingParams, int | None]
"""One share of a `sample` command: (prompts, n, params, seed)."""


def prompt_shares(n_prompts: int, n_shares: int) -> list[range]:
    """Contiguous index ranges, one per share, covering `range(n_prompts)` in order."""
    if n_shares < 1:
        raise ValueError("n_shares must be >= 1")
    base, extra = divmod(n_prompts, n_shares)
    shares, start = [], 0
    for k in range(n_shares):
        size = base + (1 if k < extra else 0)
        shares.append(range(start, start + size))
        start += size
    return shares


def share_seed(seed: int | None, share: int) -> int | None:
    """The seed share `share` samples with (None: the sampler's own stream)."""
    if seed is None:
        return None
    digest = hashlib.blake2b(f"{seed}:share:{share}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def launcher_env(rank: int, local_index: int, world: int) -> None:
    """This process's place in the node's group, where vLLM's external launcher reads it
    (its engine then runs on `cuda:<local_index>`)."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_index), WORLD_SIZE=str(world))


def my_share(payload: Sequence[SharePayload], rank: int, ranks_per_share: int) -> SharePayload:
    return payload[rank // ranks_per_share]


def sample_share(sampler: Sampler, share: SharePayload) -> list[list[Completion]]:
    prompts, n, params, seed = share
    return sampler.generate(prompts, n, params, seed=seed) if prompts else []


class RankedSampler:
    """Rank 0's sampler: its own share through `local`, the others' through the ranks."""

    def __init__(self, local: Sampler, ranks: TrainingRanks, ranks_per_share: int = 1) -> None:
        world = ranks.info.world
        if ranks_per_share < 1 or world % ranks_per_share:
            raise ValueError(f"{world} ranks do not split into groups of {ranks_per_share}")
        self.local = local
        self.ranks = ranks
        self.ranks_per_share = ranks_per_share
        self.n_shares = world // ranks_per_share
        self.last_counts: list[int] = []
        """Groups each share returned in the last call (what each sampler did)."""

    def generate(
        self, prompts: Sequence[Prompt], n: int, params: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]:
        """`n` completions for each prompt, grouped per prompt in prompt order."""
        if n < 1:
            raise ValueError("n must be >= 1")
        payload = [
            ([prompts[i] for i in share], n, params, share_seed(seed, k))
            for k, share in enumerate(prompt_shares(len(prompts), self.n_shares))
        ]

        def collective() -> list[list[Completion]]:
            mine = sample_share(self.local, payload[0])
            parts: list[Any] = [None] * self.ranks.info.world
            dist.gather_object(mine, parts, dst=0)
            # A share sampled by a group of ranks comes back from each: its first's counts.
            shares = parts[:: self.ranks_per_share]
            self.last_counts = [len(part) for part in shares]
            return [group for part in shares for group in part]

        return self.ranks.run(Command("sample", payload), collective)

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Rank 0's own sampler (the other ranks refresh theirs in the weights' command)."""
        self.local.update_weights(state_dict)

    def release_process_groups(self) -> None:
        """Whatever groups the local sampler formed over the node's (vLLM's engine)."""
        release = getattr(self.local, "release_process_groups", None)
        if release is not None:
            release()


class SamplerReplica:
    """A training rank's own sampler, kept at the trainer's weights."""

    def __init__(self, sampler: Sampler, trainer: Any, sharded: bool, ranks_per_share: int) -> None:
        self.sampler = sampler
        """Under FSDP built on a whole copy of the model (the trainer holds shards)."""
        self.trainer = trainer
        self.sharded = sharded
        self.ranks_per_share = ranks_per_share

    def serve(self, payload: Sequence[SharePayload], rank: int) -> None:
        """This rank's side of a `sample` command."""
        mine = sample_share(self.sampler, my_share(payload, rank, self.ranks_per_share))
        dist.gather_object(mine, None, dst=0)

    def refresh(self) -> None:
        """The trainer's current weights into the sampler (under FSDP every rank calls
        this together: the shards are gathered to every rank)."""
        if self.sharded:  # whole tensors on every rank, copied into the sampler's own
            weights = self.trainer.parallel.gathered_state_dict(everywhere=True)
        else:
            weights = self.trainer.state_dict_for_sampler()
        self.sampler.update_weights(weights)
