"""Which tokens of a peer's completion the local policy may be trained on: a pure function.

A reward belongs to a whole trajectory, and a text that never ended has no final answer
to reward. Rules (`train.foreign_trajectory`):

- `ended` (the default): a peer's completion is trained only if its sampler stopped on
  its own (the wire's `finished` bit) and it fits the local budget (`max_new_tokens`)
  with the local EOS; the EOS itself is trained where the caller says so (`append_eos`:
  the trainer's `foreign_stop`, by default only after completions with a positive
  advantage). Unfinished ones are left out: DAPO's overlong filtering, applied to peers'
  samples. A peer can then only teach a completion that ends.
- `whole`: also an unfinished completion that fills the local budget exactly (a
  trajectory the local sampler could have produced, cut where it would be cut).
- `text`: the earliest rule, kept as a baseline: the text as it re-tokenizes, cut to the
  budget when longer (`truncated`), EOS appended only with `append_eos`.

Left-out completions (`partial`) still count in their group's advantages (their rewards
are real); they are just not trained on.

Why (measured in docs/sapo_grid.md): the `signal_bait` attack (simnet.attackers) sends
"answer + space", unfinished, which a reward that strips whitespace scores correct.
Under `text` the prefix is trained without a stop token and nodes learn to never stop
after the answer. Under `whole` a two-digit answer plus the space fills the 3-token
budget, so the bait is still trained and the habit still spreads to one-digit answers.
Under `ended` none of it is trained. A bait that claims `finished` is trained, but the
node passes peers' texts in the form the reward reads (`rewards.registry.canonical_completion`,
`train.foreign_text`), so "answer + space" arrives here as "answer".

Invariants: never returns more than `budget` ids (when a budget is known); never returns
ids other than the completion's own tokens and, where it finished and `append_eos`, one
EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TrajectoryRule = Literal["ended", "whole", "text"]


@dataclass(frozen=True)
class PeerIds:
    ids: list[int] | None
    """What to train (None: left out of the loss)."""
    outcome: Literal["whole", "partial", "truncated", "as_text"]
    """`whole`: a local trajectory; `partial`: left out (`ended`, `whole`); `truncated`:
    cut to the budget (`text` rule); `as_text`: kept as it re-tokenized (`text` rule)."""
    ended_without_eos: bool = False
    """It ended, but its stop token is not trained (`append_eos` off): a sender's
    per-token logprobs, which include the stop token's, have one entry too many."""


def peer_completion_ids(
    ids: list[int],
    finished: bool,
    eos_id: int | None,
    budget: int | None,
    rule: TrajectoryRule,
    append_eos: bool,
) -> PeerIds:
    """The ids to train for a peer completion that re-tokenized to `ids` (see the module
    docstring). `budget` is the local `max_new_tokens` (None: unknown, nothing is cut, and
    `whole` takes an unfinished completion as it is). `append_eos`: train the local EOS
    after a completion that ended (`ended`, `whole`: it must fit the budget either way;
    `text`: the `foreign_eos` setting)."""
    if rule in ("ended", "whole"):
        if finished and eos_id is not None:
            if budget is None or len(ids) + 1 <= budget:
                if append_eos:
                    return PeerIds([*ids, int(eos_id)], "whole")
                return PeerIds(list(ids), "whole", ended_without_eos=True)
            return PeerIds(None, "partial")
        if rule == "whole" and (budget is None or len(ids) == budget):
            return PeerIds(list(ids), "whole")
        return PeerIds(None, "partial")
    end = finished and append_eos and eos_id is not None
    if budget is not None and len(ids) + end > budget:
        return PeerIds(list(ids[:budget]), "truncated")
    return PeerIds([*ids, int(eos_id)] if end else list(ids), "as_text")  # type: ignore[arg-type]
