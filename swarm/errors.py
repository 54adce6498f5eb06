"""The one error type the wire layer raises.

Invariant: every refusal of peer input is a `WireError` whose `reason` is a short,
stable, machine-readable token (used as a metrics key). Nothing a peer sends makes the
decoder raise any other exception type.
"""

from __future__ import annotations


class WireError(ValueError):
    """A message from the network was refused; `reason` names why (a counter key)."""

    def __init__(self, reason: str, detail: str = "", *, signer: str | None = None) -> None:
        self.reason = reason
        self.detail = detail
        self.signer = signer
        """The peer whose valid signature the refused message carries, if one was checked
        (so the refusal can be blamed on it; never set from an unverified claim)."""
        super().__init__(f"{reason}: {detail}" if detail else reason)


class ConfigError(ValueError):
    """A user's configuration is unusable; the message names the file, field and fix."""


class ModelLoadError(ConfigError):
    """The configured model or tokenizer could not be loaded; the message is one line
    naming the model reference and the cause."""


class RanksFailed(RuntimeError):
    """One of a node's training ranks (torch.distributed processes) failed or died; the
    message names it and where its log is. The node stops; its last checkpoint stands."""
