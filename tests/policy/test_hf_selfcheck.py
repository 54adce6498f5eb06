"""What `policy` relies on inside transformers and PEFT (`policy.hf_selfcheck`, issue 34):
each check passes on the installed versions, and each simulated change fails loudly (an
error naming the library, its version and the pin) or, for a speed-up with an exact
fallback, degrades with one WARNING and a count."""

from __future__ import annotations

import logging
from importlib.metadata import version
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel, Qwen2Config
from transformers.configuration_utils import PreTrainedConfig

import swarm.internals as internals
from policy.hf_selfcheck import (
    PEFT,
    TRANSFORMERS,
    attention_implementation,
    check_family_config,
    check_lora_layout,
    cpu_attention_without_kv_copies,
    no_split_module_names,
)
from policy.loading import model_family
from policy.lora import apply_lora
from policy.tiny import build_tiny_model
from policy.token_logprobs import TokenLogprobs
from swarm.config.learning import LoraConfig
from swarm.internals import DEGRADED, LibraryInternalsChanged

pytestmark = pytest.mark.usefixtures("one_thread")


def _loud(exc: pytest.ExceptionInfo[LibraryInternalsChanged], library: tuple, dist: str) -> str:
    text = str(exc.value)
    assert f"{library[0]} {version(dist)} (installed)" in text
    assert f"pyproject.toml pins {library[2]}" in text
    return text


def test_the_installed_transformers_passes() -> None:
    model = build_tiny_model("tiny", 0)
    check_family_config(model.config)
    for config in (Qwen2Config(), Qwen2Config(attn_implementation="eager")):
        check_family_config(config)
    assert attention_implementation(model.config) in ("sdpa", "eager")
    assert no_split_module_names(model.modules()) == {"Qwen2DecoderLayer"}


def test_a_runtime_key_in_the_config_fails_the_family_loudly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = build_tiny_model("tiny", 0)
    family = model_family(model)
    to_dict = PreTrainedConfig.to_dict

    def with_attention(self: Any) -> dict[str, Any]:  # a version serializing it publicly
        return {**to_dict(self), "attn_implementation": self._attn_implementation}

    monkeypatch.setattr(PreTrainedConfig, "to_dict", with_attention)
    with pytest.raises(LibraryInternalsChanged) as exc:
        model_family(model)
    text = _loud(exc, TRANSFORMERS, "transformers")
    assert "changes with the attention implementation eager in attn_implementation" in text
    monkeypatch.undo()
    assert model_family(model) == family


def test_a_config_without_attention_implementation_degrades_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = build_tiny_model("tiny", 0)
    monkeypatch.setattr(internals, "_warned", set())  # as in a fresh process
    monkeypatch.delattr(PreTrainedConfig, "_attn_implementation")
    before = DEGRADED["transformers"]
    with caplog.at_level(logging.WARNING, logger="swarm.internals"):
        assert attention_implementation(model.config) is None
        logprobs = TokenLogprobs(
            model, torch.device("cpu"), torch.float32, torch.float32, 1.0, pad_id=0
        )
    assert not logprobs.packed and "None" in (logprobs.fallback_reason or "")
    assert DEGRADED["transformers"] == before + 2
    (warning,) = [r for r in caplog.records if "_attn_implementation" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert f"transformers {version('transformers')}" in warning.getMessage()
    assert TRANSFORMERS[2] in warning.getMessage()


def test_no_split_modules_gone_degrades_to_one_fsdp_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build_tiny_model("tiny", 0)
    monkeypatch.delattr(PreTrainedModel, "_no_split_modules")
    before = DEGRADED["transformers"]
    assert no_split_module_names(model.modules()) == set()
    assert DEGRADED["transformers"] == before + 1


def test_the_installed_peft_layout_passes() -> None:
    base = build_tiny_model("tiny", 0)
    names = list(base.state_dict())
    wrapped = apply_lora(base, LoraConfig(enabled=True, rank=2, alpha=4.0))
    check_lora_layout(wrapped.state_dict(), names)


def test_a_changed_peft_layout_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    base = build_tiny_model("tiny", 0)
    names = list(base.state_dict())
    wrapped = apply_lora(base, LoraConfig(enabled=True, rank=2, alpha=4.0))
    renamed = [n.replace(".lora_A.default.", ".lora_A.adapter0.") for n in wrapped.state_dict()]
    with pytest.raises(LibraryInternalsChanged) as exc:
        check_lora_layout(renamed, names)
    text = _loud(exc, PEFT, "peft")
    assert "no longer map onto the base model's" in text and "lora_A.adapter0" in text

    import peft

    monkeypatch.setattr(peft, "get_peft_model", lambda model, config: model)  # no wrapper
    with pytest.raises(LibraryInternalsChanged, match="no adapter tensors named"):
        apply_lora(build_tiny_model("tiny", 0), LoraConfig(enabled=True, rank=2, alpha=4.0))


def test_cpu_attention_reads_grouped_key_value_heads_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from transformers.integrations import sdpa_attention

    current = sdpa_attention.use_gqa_in_sdpa  # replaced already if a sampler was made
    original = getattr(current, "_swarm_original", current)
    monkeypatch.setattr(sdpa_attention, "use_gqa_in_sdpa", original)  # restored after
    assert cpu_attention_without_kv_copies()
    assert cpu_attention_without_kv_copies()  # idempotent: wrapped once
    patched = sdpa_attention.use_gqa_in_sdpa
    assert patched is not original and getattr(patched, "_swarm_cpu_gqa", False)
    mask = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    key = torch.zeros(1, 3, 2, 64)
    assert patched(mask, key, key)  # CPU with a mask: transformers alone says no
    assert not original(mask, key, key)
    meta = key.to("meta")  # any other device: transformers' own rule decides
    assert patched(mask, meta, meta) == original(mask, meta, meta)
    # The numbers are the copies' numbers: 9 query heads over 3 key/value heads, masked.
    q, k, v = torch.randn(2, 9, 5, 16), torch.randn(2, 3, 5, 16), torch.randn(2, 3, 5, 16)
    allowed = torch.rand(2, 1, 5, 5) > 0.3
    allowed |= torch.eye(5, dtype=torch.bool)
    copied = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), attn_mask=allowed
    )
    in_place = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed, enable_gqa=True
    )
    assert torch.allclose(copied, in_place, atol=1e-6)


def test_without_the_rule_cpu_attention_copies_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from transformers.integrations import sdpa_attention

    monkeypatch.delattr(sdpa_attention, "use_gqa_in_sdpa")
    before = DEGRADED[TRANSFORMERS[0]]
    with caplog.at_level(logging.WARNING):
        assert not cpu_attention_without_kv_copies()
    assert DEGRADED[TRANSFORMERS[0]] == before + 1
