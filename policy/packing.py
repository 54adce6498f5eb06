"""Shared-prefix packing: a group's prompt computed once, its completions against it, and
the prefix the prompts of a row share (a node's system prompt and a source's rules and
solved examples) computed once per row.

A packed batch holds rows; a row holds its *common prefix* (possibly empty), then one or
more *segments*; a segment is the rest of one prompt followed by the completions that
share it, each placed after the previous one:

    [c0 .. cC-1 | pC .. pP-1 | a0 a1 .. | b0 b1 .. | ..] [next segment ..] [pad ..]

Invariants (what makes the result equal the plain per-sequence forward):
- Positions: a prompt's tokens take 0..P-1 (the common prefix 0..C-1, the segment's own
  part C..P-1); every completion continues from P, so each of its tokens has the position
  it has in `prompt + completion`.
- Attention (`allowed[r, 0, q, k]`, True = query q may attend key k): a token sees the
  earlier tokens (and itself) of its row's common prefix, of its own segment's prompt
  and of its own completion, nothing else. A padding token sees only itself, so no mask
  row is empty (an empty row would give NaN in softmax, and NaN * 0 is still NaN in the
  backward).
- A row's common prefix is the longest prefix its segments' prompts share, short of each
  prompt's last token (which predicts its completion's first); none for a lone segment
  or without sharing.
- Families: segments are split into families, each packed into rows of its own with
  the prefix its members share. Prompts of one source share a long prefix and prompts
  of two sources little (a mixture, or peers' groups of another source), so one prefix
  for a whole mixed batch would be the system turn alone. Sorted by prompt, a run of
  segments is split where the prefix its two halves share is shortest, and only where
  the two halves' prefixes together save more tokens than the run's own (applied
  recursively, bottom-up): a batch of one source stays one family unless splitting
  computes fewer tokens.
- Targets: completion token t of a sequence is predicted at the index of the token
  before it, which is the prompt's last token for t = 0. `targets` list every trained
  position once, sequence by sequence, in order.
- Consecutive sequences whose prompts are equal share a segment (the caller orders a
  group's completions together); `share_prefix=False` gives every sequence its own
  segment (the same layout without sharing).
- Rows: a family's segments are placed first-fit by decreasing length into rows as wide
  as its longest segment, so no row is wider than the plain layout's widest sequence
  would need for that segment, and short segments fill the room that would be padding.
  With a common prefix, rows are up to `PREFIX_ROW_TOKENS` wide (more segments behind
  one copy of the prefix).

Pure: lists of token ids in, CPU tensors out; no model, no autograd.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch

PREFIX_ROW_TOKENS = 2048
"""With a common prefix, a row holds up to this many tokens (or twice the widest segment,
prefix included, where that is more), so that one copy of the prefix serves many
segments; attention work and its transient memory grow with the row's width squared."""


@dataclass(frozen=True)
class PackedBatch:
    """Tensors of one packed forward (CPU; move them to the model's device)."""

    input_ids: torch.Tensor
    """[R, W] token ids, padding `pad_id`."""
    position_ids: torch.Tensor
    """[R, W] positions (see the module docstring); 0 on padding."""
    allowed: torch.Tensor
    """[R, 1, W, W] boolean attention mask, True where a query may attend a key."""
    target_row: torch.Tensor
    """[N] row of the position whose output predicts each trained token."""
    target_col: torch.Tensor
    """[N] column of that position."""
    target_ids: torch.Tensor
    """[N] the trained tokens."""
    target_seq: torch.Tensor
    """[N] which input sequence each trained token belongs to."""
    target_pos: torch.Tensor
    """[N] its index within that sequence's completion."""
    n_sequences: int
    max_completion: int
    """The longest completion (the width of per-sequence [B, T] outputs)."""
    n_real_tokens: int
    """Tokens computed that are not padding."""
    n_plain_tokens: int
    """Tokens a plain layout (`prompt + completion` per sequence, unpadded) computes."""

    @property
    def n_computed_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def padding_share(self) -> float:
        """Share of computed positions that are padding."""
        return 1.0 - self.n_real_tokens / max(self.n_computed_tokens, 1)


@dataclass
class _Segment:
    prompt: list[int]
    completions: list[tuple[int, list[int]]]
    """(sequence index, completion ids)."""

    def __len__(self) -> int:
        return len(self.prompt) + sum(len(c) for _, c in self.completions)

    def own(self, shared: int) -> int:
        """Tokens it adds to a row that already holds the first `shared` prompt tokens."""
        return len(self) - shared


def _segments(
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]], share_prefix: bool
) -> list[_Segment]:
    segments: list[_Segment] = []
    for index, (prompt, completion) in enumerate(sequences):
        if not prompt or not completion:
            raise ValueError(f"sequence {index}: prompt and completion must be non-empty")
        prompt = list(prompt)
        if share_prefix and segments and segments[-1].prompt == prompt:
            segments[-1].completions.append((index, list(completion)))
        else:
            segments.append(_Segment(prompt, [(index, list(completion))]))
    return segments


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """The length of the longest prefix every prompt shares, short of each one's last
    token (0 for fewer than two prompts)."""
    if len(prompts) < 2:
        return 0
    first = prompts[0]
    length = min(len(p) for p in prompts) - 1
    for prompt in prompts[1:]:
        same = 0
        while same < length and prompt[same] == first[same]:
            same += 1
        length = same
    return max(length, 0)


def _families(segments: list[_Segment]) -> list[tuple[int, list[_Segment]]]:
    """(shared prefix length, members) of each family (see the module docstring).

    The runs form a tree (each split at its weakest link); it is walked children first
    with a stack of its own, so that thousands of segments need no deep recursion."""
    order = sorted(segments, key=lambda s: s.prompt)
    links = [common_prefix([a.prompt, b.prompt]) for a, b in pairwise(order)]
    done: dict[tuple[int, int], list[tuple[int, list[_Segment]]]] = {}
    stack = [(0, len(order), False)]
    while stack:
        lo, hi, children_done = stack.pop()
        if hi - lo < 2:
            done[lo, hi] = [(0, order[lo:hi])]
            continue
        inner = links[lo : hi - 1]
        shared = min(inner)  # sorted: the run's common prefix is its weakest link
        cut = lo + inner.index(shared) + 1
        if not children_done:
            stack += [(lo, hi, True), (lo, cut, False), (cut, hi, False)]
            continue
        parts = done.pop((lo, cut)) + done.pop((cut, hi))
        saved_apart = sum((len(members) - 1) * length for length, members in parts)
        whole = (hi - lo - 1) * shared
        done[lo, hi] = parts if saved_apart > whole else [(shared, order[lo:hi])]
    return done[0, len(order)]


def _rows(segments: list[_Segment], shared: int) -> list[list[_Segment]]:
    widest = max(len(s) for s in segments)
    capacity = max(PREFIX_ROW_TOKENS, 2 * widest) - shared if shared else widest
    rows: list[list[_Segment]] = []
    room: list[int] = []
    for segment in sorted(segments, key=len, reverse=True):
        size = segment.own(shared)
        for i, free in enumerate(room):
            if size <= free:
                rows[i].append(segment)
                room[i] -= size
                break
        else:
            rows.append([segment])
            room.append(capacity - size)
    return rows


def pack(
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_id: int,
    share_prefix: bool = True,
) -> PackedBatch:
    """Pack `(prompt ids, completion ids)` pairs (see the module docstring)."""
    if not sequences:
        raise ValueError("nothing to pack")
    segments = _segments(sequences, share_prefix)
    families = _families(segments) if share_prefix else [(0, segments)]
    rows = [
        (shared, members[0].prompt[:shared], row)
        for shared, members in families
        for row in _rows(members, shared)
    ]
    width = max(shared + sum(s.own(shared) for s in row) for shared, _, row in rows)
    n_rows = len(rows)
    input_ids = torch.full((n_rows, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((n_rows, width), dtype=torch.long)
    segment_of = torch.full((n_rows, width), -1, dtype=torch.long)
    branch_of = torch.zeros((n_rows, width), dtype=torch.long)
    prefix = torch.zeros((n_rows, width), dtype=torch.bool)
    targets: list[tuple[int, int, int, int, int]] = []  # (seq, pos, row, col, token)
    for r, (shared, prefix_ids, row) in enumerate(rows):
        prefix[r, :shared] = True
        input_ids[r, :shared] = torch.tensor(prefix_ids, dtype=torch.long)
        position_ids[r, :shared] = torch.arange(shared)
        col = shared
        for s, segment in enumerate(row):
            p = len(segment.prompt)
            input_ids[r, col : col + p - shared] = torch.tensor(segment.prompt[shared:])
            position_ids[r, col : col + p - shared] = torch.arange(shared, p)
            segment_of[r, col : col + p - shared] = s
            prompt_last = col + p - shared - 1
            col += p - shared
            for branch, (index, completion) in enumerate(segment.completions, start=1):
                n = len(completion)
                input_ids[r, col : col + n] = torch.tensor(completion)
                position_ids[r, col : col + n] = torch.arange(p, p + n)
                segment_of[r, col : col + n] = s
                branch_of[r, col : col + n] = branch
                for t, token in enumerate(completion):
                    targets.append((index, t, r, prompt_last if t == 0 else col + t - 1, token))
                col += n
    q_seg, k_seg = segment_of[:, :, None], segment_of[:, None, :]
    q_br, k_br = branch_of[:, :, None], branch_of[:, None, :]
    causal = torch.ones((width, width), dtype=torch.bool).tril()[None]
    allowed = (q_seg == k_seg) & (q_seg >= 0) & causal & ((k_br == 0) | (k_br == q_br))
    real = (segment_of >= 0) | prefix
    allowed |= prefix[:, None, :] & real[:, :, None] & causal  # the row's common prefix
    allowed |= torch.eye(width, dtype=torch.bool)[None] & ~real[:, :, None]
    targets.sort()
    columns = list(zip(*targets, strict=True))
    n_real = int(real.sum())
    return PackedBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        allowed=allowed[:, None],
        target_seq=torch.tensor(columns[0], dtype=torch.long),
        target_pos=torch.tensor(columns[1], dtype=torch.long),
        target_row=torch.tensor(columns[2], dtype=torch.long),
        target_col=torch.tensor(columns[3], dtype=torch.long),
        target_ids=torch.tensor(columns[4], dtype=torch.long),
        n_sequences=len(sequences),
        max_completion=max(len(c) for _, c in sequences),
        n_real_tokens=n_real,
        n_plain_tokens=sum(len(p) + len(c) for p, c in sequences),
    )


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The boolean mask as the additive float mask eager attention adds to its scores."""
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
