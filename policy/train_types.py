"""What the GRPO trainer takes and reports (`policy.trainer`): a group to train on, and the
figures of one step.

Invariants: plain data; a `TrainGroup`'s per-completion lists all have one entry per
completion (checked at construction), and its sampler logprobs one per sampled token.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainGroup:
    """One prompt, its completions and their (locally computed) rewards."""

    prompt: str
    completions: list[str]
    rewards: list[float]
    completion_token_ids: list[list[int]] | None = None
    """Sampled ids (local groups); None re-tokenizes the text (foreign groups)."""
    sampler_logprobs: list[list[float]] | None = None
    """Per-token sampler logprobs matching `completion_token_ids` (for importance weights);
    for a peer's group, the peer's own (give them only for a peer of our model family)."""
    local: bool = True
    """False for a peer's group: its token ids are ignored (the text is re-tokenized) and
    its `sampler_logprobs` are used only per `train.peer_offpolicy`."""
    finished: list[bool] | None = None
    """For re-tokenized completions: which ended with EOS (the local EOS is appended)."""
    peer_token_ids: list[list[int] | None] | None = None
    """For a peer's group: per completion the token ids the peer sampled, without its stop
    token (None: not carried or not usable); trained in place of the re-tokenized text
    under `train.peer_tokens = "as_sampled"` where they decode to exactly the text."""
    prompt_ids: list[int] | None = None
    """The rendered prompt's token ids (as sampled); None renders `prompt` here."""

    def __post_init__(self) -> None:
        g = len(self.completions)
        if len(self.rewards) != g:
            raise ValueError("rewards and completions differ in length")
        for name in ("completion_token_ids", "sampler_logprobs", "finished", "peer_token_ids"):
            value = getattr(self, name)
            if value is not None and len(value) != g:
                raise ValueError(f"{name} and completions differ in length")
        if self.sampler_logprobs is not None and self.completion_token_ids is not None:
            for ids, lps in zip(self.completion_token_ids, self.sampler_logprobs, strict=True):
                if len(ids) != len(lps):
                    raise ValueError("sampler_logprobs and completion_token_ids differ in length")


@dataclass
class StepStats:
    """What one `Trainer.step` did."""

    loss: float = 0.0
    n_groups: int = 0
    """Groups trained on."""
    n_skipped: int = 0
    """Groups skipped for zero reward variance (or with nothing left to train on)."""
    n_too_long: int = 0
    """Completions left out for exceeding `max_completion_tokens`."""
    n_truncated: int = 0
    """Foreign completions cut to the local `max_new_tokens` (trained without EOS;
    `foreign_trajectory = "text"` only)."""
    n_peer_partial: int = 0
    """Peer completions left out of the loss by `foreign_trajectory` (`ended`: did not end
    within the local budget; `whole`: nor fill it; `policy.trajectories`)."""
    learning_rate: float = 0.0
    """Learning rate of the step's (last) optimizer step."""
    n_sequences: int = 0
    n_tokens: int = 0
    clip_frac: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    """Mean policy entropy over the step's tokens (0.0 unless `entropy_coef` > 0)."""
    grad_norm: float = 0.0
    importance_weight_mean: float = 1.0
    """Mean truncated importance weight over local tokens with sampler logprobs."""
    n_peer_tis: int = 0
    """Peer completions trained with truncated importance weights against their logprobs."""
    n_peer_mismatch: int = 0
    """Peer completions whose carried logprobs did not match their local token count
    (they got `foreign_rule`, counted there too)."""
    n_peer_as_sampled: int = 0
    """Peer completions trained on the token ids the peer sampled (`peer_tokens`)."""
    n_peer_ids_refused: int = 0
    """Peer completions whose carried token ids did not decode to the text trained (or
    held an id outside our vocabulary): re-tokenized instead."""
    n_peer_negative: int = 0
    """Peer completions with an advantage <= 0 left out of the loss
    (`peer_advantages = "positive"`)."""
    n_peer_ratio_one: int = 0
    """Peer completions trained at weight 1 (`foreign_rule = "ratio_one"`)."""
    n_peer_plausible: int = 0
    """Peer completions the `plausible` rule kept (trained at weight 1)."""
    n_peer_implausible: int = 0
    """Peer completions the `plausible` rule left out of the loss."""
    peer_weight_mean: float = 1.0
    """Mean truncated importance weight over `n_peer_tis` completions' tokens."""
    reward_mean: float = 0.0
    """Mean reward over every completion of every group given (trained or skipped)."""
    group_logprob: list[float | None] = field(default_factory=list)
    """Per group given, in order: the mean per-token logprob of its trained tokens under
    the policy before the step (None: none of its completions was trained): how
    plausible the policy found each group (rounds record ours and each peer's)."""
    policy_version: int = 0
    seconds: float = 0.0
    """Wall time of the whole step."""
    tokens_computed: int = 0
    """Token positions run through the model in the step's forwards (all passes)."""
    padding_share: float = 0.0
    """Share of `tokens_computed` that were padding."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per phase: `prepare` (advantages, tokens), `old_logprobs` (the separate pass
    and the weights from it; ~0 at `num_iterations = 1`), `update` (forward, backward,
    optimizer; the reference policy's logprobs)."""

    def as_dict(self) -> dict[str, Any]:
        """Flat JSON-able dict (timings as `time_<phase>`)."""
        d = asdict(self)
        d.update({f"time_{k}": v for k, v in d.pop("timings").items()})
        return d
