"""A GRPO step's rows: each trained completion as prompt + completion token ids, its
advantage and how its tokens are weighted (`RowBuilder`, used by `policy.trainer`).

Invariants:
1. Groups whose rewards are all equal (or that have one completion) carry no GRPO
   signal: they are skipped and counted (`n_skipped`), never trained on; so is a group
   left with no row.
2. Advantages per group (`policy.advantages`; with `scale_rewards = "batch"` divided by
   the std of every reward of the step's groups); MC-GRPO's pivot sample is dropped.
3. Token ids: prompts are task questions rendered by the node's `PromptRenderer` (chat
   template or plain; the sampler uses the same one). A local group's sampled ids are
   used as they are; a foreign group's (peer's) completion texts are re-tokenized with
   the local tokenizer (separately from the prompt, so the boundary is exact), or, under
   `peer_tokens = "as_sampled"`, taken as the ids a same-family peer sampled where they
   decode to exactly the text (a claim checked, never trusted: other ids are
   re-tokenized, `n_peer_ids_refused`). Which of
   its tokens are trained is `policy.trajectories`' rule (`foreign_trajectory`): by
   default only a completion that ended (the caller says it `finished`), within the local
   `max_new_tokens` with the local EOS, which is trained where its advantage is positive
   (`foreign_stop`); anything else is left out of the
   loss (`n_peer_partial`). So a peer with a larger budget cannot make one sample weigh
   more than a local one, nor teach a text that never ended with the reward of a text.
   Completions longer than `max_completion_tokens` are left out (`n_too_long`); under
   `peer_advantages = "positive"` so is every peer completion whose advantage is not
   positive (`n_peer_negative`; it still counts in its group's advantages).
   Group size: a group of G' completions is weighted `min(1, G / G')` per sequence (G the
   local group size), folded into its advantages (the policy-gradient term scales
   exactly: the clipped objective is positively homogeneous in the advantage; the KL
   term and the token normalizers are not reweighted), so a peer's oversized group
   counts as one local group at most in the gradient and never dominates a step.
4. Local rows carry their sampler logprobs (the trainer's truncated importance weights).
   Peers' rows (`policy.offpolicy`, config `peer_offpolicy`, `foreign_rule`):
   - `peer_offpolicy = "tis"` and the group carries the peer's sampler logprobs (the
     caller gives them only for a peer of our model family, i.e. our tokenizer and base)
     and the completion re-tokenizes to exactly that many tokens: the same truncated
     weights as local samples (`n_peer_tis`). A count that differs (the peer sampled a
     non-canonical tokenization, or its text was truncated here) falls back to the
     foreign rule (`n_peer_mismatch`). A peer's claimed logprobs can raise its tokens'
     weight to `importance_cap` at most (never more), as a stale sample of our own can.
   - otherwise `foreign_rule`: `ratio_one` trains the completion at weight 1
     (`n_peer_ratio_one`); `plausible` marks it `check_plausible`: the trainer leaves it
     out of the loss (weight 0, and out of the step's normalizers) when its mean
     per-token old logprob is below `min_mean_logprob` (`n_peer_implausible`), else
     trains it at weight 1 (`n_peer_plausible`). Left-out completions still count in
     their group's advantages (computed in 2., from real rewards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from policy.advantages import batch_std, group_advantages, is_degenerate, keep_mask
from policy.prompts import PromptRenderer
from policy.sampler import encode_completion
from policy.train_types import StepStats, TrainGroup
from policy.trajectories import peer_completion_ids
from swarm.config.learning import TrainConfig


@dataclass
class Row:
    """One trained completion: `ids[:start]` its prompt, `ids[start:]` its tokens."""

    ids: list[int]
    start: int
    advantage: float
    sampler_logprobs: list[float] | None
    peer: bool = False
    """A peer's completion (its weights are reported apart from local ones)."""
    check_plausible: bool = False
    """Leave it out of the loss if the local policy finds it implausible."""
    group: int = 0
    """Index of its group in the step (a group's rows share one prompt)."""


class RowBuilder:
    """Turns a step's `TrainGroup`s into `Row`s (see the module docstring).

    `group_size`: the local group size G (None: no group-size weighting); `eos_id`: the
    local EOS; `max_new_tokens`: the local sampling budget (None: unknown).
    """

    def __init__(
        self,
        config: TrainConfig,
        group_size: int | None,
        renderer: PromptRenderer,
        tokenizer: Any,
        eos_id: int | None,
        max_new_tokens: int | None,
    ) -> None:
        self.config = config
        self.group_size = group_size
        self.renderer = renderer
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.max_new_tokens = max_new_tokens
        self.vocabulary = len(tokenizer)
        """Ids a peer's sampled tokens may take (`peer_tokens = "as_sampled"`)."""

    def rows_of(self, groups: list[TrainGroup], stats: StepStats) -> list[Row]:
        """The step's rows, each with its group's index (points 1-4)."""
        rows: list[Row] = []
        spread = None
        if self.config.scale_rewards == "batch":
            spread = batch_std([torch.tensor(g.rewards, dtype=torch.float32) for g in groups])
        for index, group in enumerate(groups):
            if is_degenerate(torch.tensor(group.rewards, dtype=torch.float32)):
                stats.n_skipped += 1
                continue
            group_rows = self.rows(group, stats, spread)
            for row in group_rows:
                row.group = index
            if group_rows:
                stats.n_groups += 1
                rows.extend(group_rows)
            else:
                stats.n_skipped += 1
        return rows

    def rows(
        self, group: TrainGroup, stats: StepStats | None = None, spread: float | None = None
    ) -> list[Row]:
        """One group's rows (points 2-4), counting what is left out into `stats`.
        `spread`: the step's `batch_std` for `scale_rewards = "batch"` (None: this group
        is the batch)."""
        rewards = torch.tensor(group.rewards, dtype=torch.float32)
        if self.config.scale_rewards == "batch" and spread is None:
            spread = batch_std([rewards])
        adv = group_advantages(
            rewards, self.config.baseline, self.config.scale_rewards, batch=spread
        )
        keep = keep_mask(rewards, self.config.baseline)
        if self.group_size is not None and len(group.completions) > self.group_size:
            adv = adv * (self.group_size / len(group.completions))
        prompt_ids = (
            list(group.prompt_ids)
            if group.prompt_ids is not None
            else self.renderer.ids(group.prompt)
        )
        use_ids = group.local and group.completion_token_ids is not None
        rows = []
        for i, text in enumerate(group.completions):
            if not keep[i]:
                continue
            if not group.local and self._drops_peer_advantage(float(adv[i])):
                if stats is not None:
                    stats.n_peer_negative += 1
                continue
            sampler_lp, ended_without_eos = None, False
            if use_ids:
                ids = list(group.completion_token_ids[i])  # type: ignore[index]
                if group.sampler_logprobs is not None:
                    sampler_lp = list(group.sampler_logprobs[i])
            else:
                body, as_sampled = self._peer_body(group, i, text, stats)
                peer = peer_completion_ids(
                    body,
                    bool(group.finished and group.finished[i]),
                    self.eos_id,
                    self.max_new_tokens,
                    self.config.foreign_trajectory,
                    append_eos=self._trains_peer_stop(float(adv[i])),
                )
                if stats is not None:
                    stats.n_truncated += peer.outcome == "truncated"
                    stats.n_peer_partial += peer.outcome == "partial"
                if peer.ids is None:
                    continue
                if stats is not None:
                    stats.n_peer_as_sampled += as_sampled
                ids, ended_without_eos = peer.ids, peer.ended_without_eos
            if not ids or not prompt_ids:
                continue
            if len(ids) > self.config.max_completion_tokens:
                if stats is not None:
                    stats.n_too_long += 1
                continue
            row = Row(prompt_ids + ids, len(prompt_ids), float(adv[i]), sampler_lp)
            if not group.local:
                peer_lp = group.sampler_logprobs[i] if group.sampler_logprobs else None
                if peer_lp and ended_without_eos:
                    peer_lp = peer_lp[:-1]  # the stop token's, which is not trained
                self._peer_treatment(row, len(ids), peer_lp, stats)
            rows.append(row)
        return rows

    def _peer_body(
        self, group: TrainGroup, i: int, text: str, stats: StepStats | None
    ) -> tuple[list[int], bool]:
        """A peer completion's tokens before the trajectory rule, and whether they are as
        sampled: the ids the peer sampled under `peer_tokens = "as_sampled"` where they
        are ours to read (every id in our vocabulary) and decode to exactly `text`, else
        `text` re-tokenized (ids that came and did not match: `n_peer_ids_refused`)."""
        sent = group.peer_token_ids[i] if group.peer_token_ids else None
        if self.config.peer_tokens == "as_sampled" and sent is not None:
            if all(0 <= t < self.vocabulary for t in sent) and (
                self.tokenizer.decode(sent, skip_special_tokens=False) == text
            ):
                return list(sent), True
            if stats is not None:
                stats.n_peer_ids_refused += 1
        return encode_completion(self.tokenizer, text), False

    def _drops_peer_advantage(self, advantage: float) -> bool:
        """Whether a peer's completion with this advantage is left out of the loss
        (`peer_advantages = "positive"`: every one not above its group's mean)."""
        return self.config.peer_advantages == "positive" and advantage <= 0

    def _trains_peer_stop(self, advantage: float) -> bool:
        """Whether a peer's ended completion with this advantage is trained with our EOS."""
        if self.config.foreign_trajectory == "text":
            return self.config.foreign_eos
        return self.config.foreign_stop == "all" or advantage > 0

    def _peer_treatment(
        self, row: Row, n_ids: int, peer_lp: list[float] | None, stats: StepStats | None
    ) -> None:
        """Set a peer row's weights rule (see the module docstring, point 4)."""
        stats = stats if stats is not None else StepStats()
        row.peer = True
        if self.config.peer_offpolicy == "tis" and peer_lp is not None:
            if len(peer_lp) == n_ids:
                row.sampler_logprobs = list(peer_lp)
                stats.n_peer_tis += 1
                return
            stats.n_peer_mismatch += 1
        if self.config.foreign_rule == "plausible":
            row.check_plausible = True  # counted once old logprobs are known
        else:
            stats.n_peer_ratio_one += 1
