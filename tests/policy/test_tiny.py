"""The built-in tiny model and tokenizer; loading and model families."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from policy.loading import load_policy_model, load_tokenizer, model_family
from policy.tiny import TINY_CHARS, TINY_VARIANTS, build_tiny_model, char_tokenizer
from swarm.config.learning import ModelConfig
from swarm.config.models import BUILTIN_MODELS

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tokenizer_round_trip() -> None:
    tok = char_tokenizer()
    for text in ("3+4=7", "copy abc=abc", " a  b\nc ", TINY_CHARS, ""):
        ids = tok(text)["input_ids"]
        assert len(ids) == len(text)
        assert tok.decode(ids) == text
    assert tok.decode(tok("ab")["input_ids"] + [tok.eos_token_id], skip_special_tokens=True) == "ab"
    assert tok("A")["input_ids"] == [tok.unk_token_id]
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)


def test_tokenizer_orders_differ() -> None:
    a, b = char_tokenizer(), char_tokenizer(TINY_CHARS[::-1])
    assert a("abc")["input_ids"] != b("abc")["input_ids"]
    assert b.decode(b("abc")["input_ids"]) == "abc"
    with pytest.raises(ValueError):
        char_tokenizer("aa")


def test_build_is_deterministic_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    m1, m2 = build_tiny_model("tiny", 0), build_tiny_model("tiny", 0)
    assert torch.equal(torch.rand(3), expected_next)
    for (n1, p1), (n2, p2) in zip(m1.state_dict().items(), m2.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)
    n_params = sum(p.numel() for p in m1.parameters())
    assert 0.8e6 < n_params < 1.2e6


def test_model_family() -> None:
    base = model_family(build_tiny_model("tiny", 0))
    assert base == model_family(build_tiny_model("tiny", 0))
    assert base != model_family(build_tiny_model("tiny", 1))
    assert base != model_family(build_tiny_model("tiny-2x", 0))
    trained = build_tiny_model("tiny", 0)
    with torch.no_grad():
        next(trained.parameters()).add_(1e-3)
    assert model_family(trained) != base
    assert len(base) == 32 and int(base, 16) >= 0


def test_unknown_builtin() -> None:
    with pytest.raises(ValueError, match="known: builtin:tiny, builtin:tiny-2x"):
        ModelConfig(name_or_path="builtin:huge")
    with pytest.raises(KeyError, match="builtin:tiny"):
        load_policy_model(ModelConfig.model_construct(name_or_path="builtin:huge", seed=0))


def test_config_names_exactly_the_built_variants() -> None:
    assert set(BUILTIN_MODELS) == set(TINY_VARIANTS)


def test_save_and_load_gives_identical_text_and_logits(tmp_path: Path) -> None:
    model, tok = load_policy_model(ModelConfig(name_or_path="builtin:tiny", device="cpu", seed=3))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    # The pitfall this loader avoids: AutoTokenizer picks Qwen2Tokenizer and changes text.
    text = "copy ab c=\nab c"
    auto = AutoTokenizer.from_pretrained(tmp_path)
    assert auto.decode(auto(text)["input_ids"]) != text or type(auto).__name__ != "Qwen2Tokenizer"
    model2, tok2 = load_policy_model(ModelConfig(name_or_path=str(tmp_path), device="cpu"))
    assert tok2(text)["input_ids"] == tok(text)["input_ids"]
    assert tok2.decode(tok2(text)["input_ids"]) == text
    assert load_tokenizer(str(tmp_path))(text)["input_ids"] == tok(text)["input_ids"]
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model2(ids).logits)
    assert model_family(model) == model_family(model2)
