"""The staleness rule: what a node may still use, judged from two facts it measured itself.

There is no global clock (the first design's Lamport "swarm round" let a late joiner
refuse everything as "from the future", and one peer ratchet every honest clock). A
received item (a rollout group, a weight delta) is usable while both hold:

- **age at the receiver**: it arrived at most `max_staleness` of the receiver's *own*
  rounds ago (`arrival_round` is the receiver's `rounds_done` when it arrived), and,
  optionally, at most `max_age_s` seconds ago on the receiver's clock;
- **lag at the sender**: its `policy_version` is at most `max_version_lag` behind the
  policy version its sender currently claims (the version in that sender's newest
  envelope, by sequence number). A sender can only make its own samples look fresh or
  stale; everyone else's are judged against their own claims.

Invariants:
- Pure functions of numbers the receiver holds; nothing here reads a clock.
- `SenderVersions` follows each sender's newest envelope by `seq`, not the largest
  version ever claimed, so a peer that restarts from an older checkpoint is judged by
  the version it runs now. Memory is bounded (`max_senders`, least recently updated
  forgotten first). Its state survives restarts (`state_dict`), together with each
  sender's highest seq, which the node also uses as the replay floor after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.bounded import BoundedDict


def age(own_round: int, arrival_round: int) -> int:
    """Our rounds since an item arrived (0 in the round it arrived)."""
    return own_round - arrival_round


def is_fresh(own_round: int, arrival_round: int, max_staleness: int) -> bool:
    return age(own_round, arrival_round) <= max_staleness


def version_lag(sender_version: int, item_version: int) -> int:
    """How many policy versions an item is behind what its sender runs now (may be < 0
    for an item from before a sender restarted from an older checkpoint)."""
    return sender_version - item_version


@dataclass(frozen=True)
class StalenessRule:
    max_staleness: int
    max_version_lag: int
    max_age_s: float | None = None

    def usable(
        self,
        *,
        own_round: int,
        arrival_round: int,
        item_version: int,
        sender_version: int,
        now: float | None = None,
        arrival_time: float | None = None,
    ) -> bool:
        if not is_fresh(own_round, arrival_round, self.max_staleness):
            return False
        if version_lag(sender_version, item_version) > self.max_version_lag:
            return False
        if self.max_age_s is not None and now is not None and arrival_time is not None:
            return now - arrival_time <= self.max_age_s
        return True


class SenderVersions:
    """Each sender's current policy version and highest sequence number seen."""

    def __init__(self, max_senders: int = 4096) -> None:
        if max_senders < 1:
            raise ValueError("max_senders must be >= 1")
        self.max_senders = max_senders
        self._table: BoundedDict[str, tuple[int, int]] = BoundedDict(max_senders)
        """sender -> (seq, version); the least recently updated sender leaves first."""

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, sender: object) -> bool:
        return sender in self._table

    def observe(self, sender: str, seq: int, policy_version: int) -> None:
        """Note an authenticated envelope; only a newer seq changes the sender's version."""
        held = self._table.get(sender)
        if held is not None and held[0] >= seq:
            return
        self._table[sender] = (seq, policy_version)

    def version(self, sender: str, default: int = 0) -> int:
        held = self._table.get(sender)
        return default if held is None else held[1]

    def highest_seq(self, sender: str) -> int | None:
        held = self._table.get(sender)
        return None if held is None else held[0]

    def state_dict(self) -> dict[str, list[int]]:
        return {sender: [seq, version] for sender, (seq, version) in self._table.items()}

    def load_state_dict(self, state: dict[str, list[int]]) -> None:
        self._table.clear()
        for sender, (seq, version) in state.items():
            self.observe(str(sender), int(seq), int(version))
