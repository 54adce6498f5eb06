"""Shared-prefix packing: the layout, positions, mask and targets against the rule in
`policy.packing`'s docstring, checked one pair of tokens at a time."""

from __future__ import annotations

import pytest
import torch

from policy.packing import _families, _Segment, additive_mask, common_prefix, pack

PROMPT_A = [10, 11, 12, 13]
PROMPT_B = [20, 21]
SEQUENCES = [
    (PROMPT_A, [1, 2, 3]),
    (PROMPT_A, [4]),
    (PROMPT_A, [5, 6]),
    (PROMPT_B, [7, 8, 9, 7, 8]),
    (PROMPT_B, [9]),
]


def _tokens(batch, row: int) -> list[tuple[int, int, int]]:  # type: ignore[no-untyped-def]
    """(token, position, column) of a row's real tokens."""
    return [
        (int(batch.input_ids[row, c]), int(batch.position_ids[row, c]), c)
        for c in range(batch.input_ids.shape[1])
    ]


def test_a_groups_prompt_is_laid_out_once_with_its_completions_after_it() -> None:
    batch = pack(SEQUENCES, pad_id=0)
    flat = batch.input_ids.flatten().tolist()
    assert flat.count(10) == 1 and flat.count(20) == 1  # each prompt once
    assert batch.n_real_tokens == len(PROMPT_A) + 6 + len(PROMPT_B) + 6
    assert batch.n_plain_tokens == 3 * 4 + 6 + 2 * 2 + 6
    # Widest segment: PROMPT_A and its completions, 10 tokens; B's 8 fit no other row.
    assert batch.input_ids.shape == (2, 10)
    assert batch.padding_share == pytest.approx(2 / 20)


def test_each_completion_sees_exactly_its_prompt_and_its_own_earlier_tokens() -> None:
    batch = pack(SEQUENCES, pad_id=0)
    for r in range(batch.input_ids.shape[0]):
        seen = batch.allowed[r, 0]
        cols = batch.input_ids.shape[1]
        # Recover each column's (segment, completion) from the layout, independently.
        owner: list[tuple[int, int] | None] = []
        segment, branch, col = -1, 0, 0
        ids = batch.input_ids[r].tolist()
        while col < cols:
            for s, (prompt, _) in enumerate(SEQUENCES):
                if ids[col : col + len(prompt)] == list(prompt) and batch.position_ids[r, col] == 0:
                    segment, branch = s, 0
                    owner.extend([(segment, 0)] * len(prompt))
                    col += len(prompt)
                    break
            else:
                if ids[col] == 0 and all(v == 0 for v in ids[col:]):
                    owner.extend([None] * (cols - col))
                    break
                if col > 0 and batch.position_ids[r, col] <= batch.position_ids[r, col - 1]:
                    branch += 1
                elif branch == 0:
                    branch = 1
                owner.append((segment, branch))
                col += 1
        for q in range(cols):
            for k in range(cols):
                if owner[q] is None:
                    expected = q == k
                else:
                    same_prompt = owner[k] is not None and owner[k][0] == owner[q][0]
                    expected = (
                        same_prompt and k <= q and (owner[k][1] in (0, owner[q][1]))  # type: ignore[index]
                    )
                assert bool(seen[q, k]) == expected, (r, q, k)


def test_positions_continue_the_prompt_and_targets_are_predicted_by_the_token_before() -> None:
    batch = pack(SEQUENCES, pad_id=0)
    got: dict[int, list[int]] = {}
    for n in range(len(batch.target_ids)):
        seq, pos = int(batch.target_seq[n]), int(batch.target_pos[n])
        row, col = int(batch.target_row[n]), int(batch.target_col[n])
        prompt, completion = SEQUENCES[seq]
        assert int(batch.target_ids[n]) == completion[pos]
        before = (list(prompt) + completion)[len(prompt) + pos - 1]
        assert int(batch.input_ids[row, col]) == before
        assert int(batch.position_ids[row, col]) == len(prompt) + pos - 1
        got.setdefault(seq, []).append(pos)
    assert got == {i: list(range(len(c))) for i, (_, c) in enumerate(SEQUENCES)}


def test_without_sharing_every_sequence_has_its_own_prompt() -> None:
    batch = pack(SEQUENCES, pad_id=0, share_prefix=False)
    assert batch.n_real_tokens == batch.n_plain_tokens
    assert batch.input_ids.flatten().tolist().count(10) == 3


def test_the_additive_mask_blocks_what_the_boolean_one_forbids() -> None:
    allowed = pack(SEQUENCES, pad_id=0).allowed
    add = additive_mask(allowed, torch.float32)
    assert torch.all(add[allowed] == 0) and torch.all(
        add[~allowed] == torch.finfo(torch.float32).min
    )


def test_empty_input_is_refused() -> None:
    with pytest.raises(ValueError):
        pack([], pad_id=0)
    with pytest.raises(ValueError, match="non-empty"):
        pack([([1], [])], pad_id=0)


PREFIXED = [  # every prompt starts with [1, 2, 3]; two share [1, 2, 3, 4] too
    ([1, 2, 3, 4, 10], [5, 6]),
    ([1, 2, 3, 4, 10], [7]),
    ([1, 2, 3, 11, 12], [8, 9, 5]),
    ([1, 2, 3, 4, 13], [6]),
]


def test_the_prefix_every_prompt_shares_is_computed_once_per_row() -> None:
    assert common_prefix([p for p, _ in PREFIXED]) == 3
    assert common_prefix([[1, 2], [1, 2, 3]]) == 1  # each prompt keeps its last token
    assert common_prefix([[1, 2, 3]]) == 0 and common_prefix([[5], [5]]) == 0
    batch = pack(PREFIXED, pad_id=0)
    # One row: the prefix, then the three segments' own parts (2+3, 2+3, 2+1 tokens).
    assert batch.input_ids.shape == (1, 3 + 13)
    assert batch.input_ids[0, :3].tolist() == [1, 2, 3]
    assert batch.position_ids[0, :3].tolist() == [0, 1, 2]
    assert batch.n_real_tokens == 16 and batch.n_plain_tokens == 5 * 4 + 7
    assert pack(PREFIXED, pad_id=0, share_prefix=False).n_real_tokens == 27


MIXED = [  # two sources: each family shares 7 tokens, the two only [1]
    ([1, 2, 3, 4, 5, 6, 7, 20], [5, 6]),
    ([1, 9, 9, 9, 9, 9, 9, 30], [8, 9]),
    ([1, 2, 3, 4, 5, 6, 7, 21], [7]),
    ([1, 9, 9, 9, 9, 9, 9, 31], [6]),
]


def test_each_family_of_prompts_gets_rows_with_the_prefix_it_shares() -> None:
    batch = pack(MIXED, pad_id=0)
    assert batch.input_ids.shape[0] == 2
    heads = sorted(batch.input_ids[r, :7].tolist() for r in range(2))
    assert heads == [[1, 2, 3, 4, 5, 6, 7], [1, 9, 9, 9, 9, 9, 9]]
    assert all(batch.position_ids[r, :7].tolist() == list(range(7)) for r in range(2))
    # Per family: its prefix once, then each prompt's last token and its completion.
    assert batch.n_real_tokens == 2 * 7 + (1 + 2) + (1 + 2) + (1 + 1) + (1 + 1)
    # One prefix for the whole batch would have been the shared [1] alone.
    assert batch.n_real_tokens < 1 + 4 * 7 + 6


def test_a_split_that_saves_nothing_keeps_one_family() -> None:
    # [1..4] shared by all four; two pairs share one more token each: splitting would
    # lay out two prefixes of 5 for two segments each (saving 5 + 5) instead of one of
    # 4 for four (saving 12).
    sequences = [
        ([1, 2, 3, 4, 5, 40], [1]),
        ([1, 2, 3, 4, 5, 41], [2]),
        ([1, 2, 3, 4, 6, 42], [3]),
        ([1, 2, 3, 4, 6, 43], [4]),
    ]
    batch = pack(sequences, pad_id=0)
    assert batch.input_ids.shape[0] == 1
    assert batch.input_ids[0, :4].tolist() == [1, 2, 3, 4]
    assert batch.n_real_tokens == 4 + 4 * (2 + 1)


def test_thousands_of_nested_prompts_need_no_deep_recursion() -> None:
    # Prompt i is i fives then [7, 8]: sorted, each shares one more token with the next,
    # the deepest tree of splits there is (one per segment).
    n = 3000
    segments = [_Segment([5] * i + [7, 8], [(i, [1])]) for i in range(1, n + 1)]
    families = _families(segments)
    assert sum(len(members) for _, members in families) == n
    for shared, members in families:
        assert shared == common_prefix([m.prompt for m in members])


def test_every_trained_token_sees_exactly_its_prompt_and_earlier_completion() -> None:
    """For each trained token, the keys its predicting position may attend, in column
    order, hold `prompt + completion[:pos]` at positions 0, 1, ...: what the plain
    forward of that one sequence sees."""
    for sequences in (PREFIXED, SEQUENCES, MIXED):
        batch = pack(sequences, pad_id=0)
        for n in range(len(batch.target_ids)):
            seq, pos = int(batch.target_seq[n]), int(batch.target_pos[n])
            row, col = int(batch.target_row[n]), int(batch.target_col[n])
            prompt, completion = sequences[seq]
            keys = batch.allowed[row, 0, col].nonzero().flatten().tolist()
            assert [int(batch.input_ids[row, k]) for k in keys] == [*prompt, *completion[:pos]]
            assert [int(batch.position_ids[row, k]) for k in keys] == list(range(len(keys)))
        # The prefix's own tokens see only the prefix before them; padding only itself.
        for r in range(batch.input_ids.shape[0]):
            for q in range(batch.input_ids.shape[1]):
                keys = batch.allowed[r, 0, q].nonzero().flatten().tolist()
                assert keys and max(keys) == q
