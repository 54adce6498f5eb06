"""Rendering a task's question into the token ids this node's model sees.

Tasks are per swarm, prompts per model: the wire carries task references and the task's
raw question (`Task.prompt`); every node renders that question for its own model here,
for sampling its own groups and for training on peers' groups alike.

Invariants:
- `plain` mode encodes the question as it is, with the tokenizer's own special tokens
  (what the built-in model and base models are trained on).
- `chat` mode renders `[system?, (user=example question, assistant=<answer>example
  answer</answer>) x few_shot, user=question]` with the tokenizer's chat template and
  the generation prompt (the assistant turn opened), then encodes that text without
  adding special tokens again (the template already wrote them). Examples come from the
  caller's `examples(source)` (solved tasks of the question's own source, never one
  the node trains on); without a source or a provider there are none. Measured on
  SmolLM2-135M-Instruct: a system prompt alone never got an answer block (0/40 on
  every task tried), two example turns got one 97-100% of the time.
- `auto` is `chat` when the tokenizer has a chat template, else `plain`; asking for
  `chat` with a tokenizer that has none is a `ValueError` naming the fix.
- `PromptRenderer.ids` is a pure function of (question, source) (cached): sampler and
  trainer get identical ids for the same question.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, Literal

from swarm.config.learning import PromptConfig

PromptMode = Literal["chat", "plain"]
Examples = Callable[[str], list[tuple[str, str]]]
"""source name -> solved (question, answer) examples of that source."""


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def resolve_mode(config: PromptConfig, tokenizer: Any) -> PromptMode:
    """The mode `config.template` means for this tokenizer (see the module docstring)."""
    if config.template == "auto":
        return "chat" if has_chat_template(tokenizer) else "plain"
    if config.template == "chat" and not has_chat_template(tokenizer):
        raise ValueError(
            "prompt.template = 'chat' but this model's tokenizer has no chat template; "
            "use template = 'plain' (or 'auto') for base models and builtin:tiny"
        )
    return config.template


def plain_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` with the tokenizer's own special tokens (plain mode)."""
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


class PromptRenderer:
    """question -> model input (text for display, ids for the model)."""

    def __init__(
        self,
        tokenizer: Any,
        config: PromptConfig | None = None,
        examples: Examples | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config if config is not None else PromptConfig(template="plain")
        self.mode: PromptMode = resolve_mode(self.config, tokenizer)
        self.examples = examples
        self._encode_cached = lru_cache(maxsize=4096)(self._encode)

    def messages(self, question: str, source: str | None = None) -> list[dict[str, str]]:
        messages = []
        if self.config.system_prompt:
            messages.append({"role": "system", "content": self.config.system_prompt})
        if source is not None and self.examples is not None and self.config.few_shot:
            for example, answer in self.examples(source)[: self.config.few_shot]:
                messages.append({"role": "user", "content": example})
                messages.append({"role": "assistant", "content": f"<answer>{answer}</answer>"})
        messages.append({"role": "user", "content": question})
        return messages

    def render(self, question: str, source: str | None = None) -> str:
        """The prompt text the model is given (in chat mode, with the template's tokens)."""
        if self.mode == "plain":
            return question
        text = self.tokenizer.apply_chat_template(
            self.messages(question, source), tokenize=False, add_generation_prompt=True
        )
        return str(text)

    def _encode(self, question: str, source: str | None) -> tuple[int, ...]:
        if self.mode == "plain":
            return tuple(plain_ids(self.tokenizer, question))
        text = self.render(question, source)
        return tuple(int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def ids(self, question: str, source: str | None = None) -> list[int]:
        """Token ids of the rendered question (a fresh list)."""
        return list(self._encode_cached(question, source))
