"""A peer's completion as SmolLM2 wrote it: the sampled ids of a string its tokenizer
would split otherwise reach the trainer as sampled under `train.peer_tokens =
"as_sampled"` and re-tokenized by default (tokenizer only, no model: the trainer treats a
row's ids alike whatever their origin; `tests/policy/test_train_rows.py` has the rules)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from policy.prompts import PromptRenderer
from policy.train_rows import RowBuilder
from policy.train_types import StepStats, TrainGroup
from swarm.config.learning import PromptConfig, TrainConfig

pytestmark = [pytest.mark.realmodel]

# How SmolLM2-135M-Instruct sampled a correct string_insertion answer (2026-12-07): its
# pieces are tokens of its vocabulary, but the tokenizer splits the text otherwise.
PIECES = ("<", "answer", ">", "E", "CA", "EE", "EC", "AD", "BB", "</", "answer", ">")


def _rows(smollm2_dir: Path, peer_tokens: str) -> tuple[list[int], list[int], list, StepStats]:
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    text = "".join(PIECES)
    sampled = [i for piece in PIECES for i in tok(piece, add_special_tokens=False)["input_ids"]]
    canonical = tok(text, add_special_tokens=False)["input_ids"]
    config = TrainConfig(peer_tokens=peer_tokens)  # type: ignore[arg-type]
    renderer = PromptRenderer(tok, PromptConfig(template="chat"))
    builder = RowBuilder(config, 8, renderer, tok, tok.eos_token_id, 32)
    group = TrainGroup(
        "Insert letters.", [text, "<answer>E</answer>"], [1.0, 0.0],
        local=False, finished=[True, True], peer_token_ids=[sampled, None],
    )  # fmt: skip
    rows = builder.rows(group, stats := StepStats())
    return sampled, canonical, rows, stats


def test_the_sampled_split_is_trained_as_sampled(smollm2_dir: Path) -> None:
    sampled, canonical, rows, stats = _rows(smollm2_dir, "as_sampled")
    assert len(sampled) == len(PIECES) and sampled != canonical  # the case this is about
    eos = rows[0].ids[-1]
    assert rows[0].ids[rows[0].start :] == [*sampled, eos]
    assert stats.n_peer_as_sampled == 1 and stats.n_peer_ids_refused == 0


def test_by_default_the_text_is_re_tokenized(smollm2_dir: Path) -> None:
    _, canonical, rows, stats = _rows(smollm2_dir, "retokenized")
    assert rows[0].ids[rows[0].start : -1] == canonical
    assert stats.n_peer_as_sampled == 0
