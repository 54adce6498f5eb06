"""Hostile peers on the wire: simnet attackers, each misbehaving in one documented way.

An attacker is a simulated peer with a network slot, a key (or many, for `sybil`) and
the messages it is delivered (as a real attacker would see them), but no learner: every
`every_s` virtual seconds it sends what its behaviour says, straight into the link
model (so it can also send what an honest transport would refuse to carry, such as
oversized messages).

Behaviours (`ATTACK_BEHAVIORS`):
- `garbage`: random bytes, msgpack-shaped junk and messages over the transport limit.
- `wrong_swarm`: well-formed rollout batches, validly signed, for another swarm id.
- `replay`: re-sends honest peers' messages it received (recent and old), unchanged.
- `flood`: valid signed hellos, `flood_messages` per tick, far beyond the rate limit.
- `mismatched_prompt`: groups whose completions are the referenced task's answer but
  whose prompt is another task's (a faked question/answer pair).
- `forged_rewards`: groups of the right prompt whose completions, but one, give no
  answer at all, all claiming the top reward: claims no `[rewards]` settings produce
  (`node.rescore`). Claims that some valid settings explain (wrong answers claiming 1.0
  could be a format reward of weight 1) are not forgeries a receiver can prove, and
  harmless: it trains on the rewards it computes itself.
- `sybil`: `sybil_keys` identities of one attacker; each claims an absurd policy version
  (2**62: the old clock-ratchet attack, which made honest work look stale) and sends
  forged groups.
- `silent_mid_chunk`: starts large validly signed chunked messages and goes silent
  halfway, leaving partial sets in receivers' reassembly buffers.
- `signal_bait`: `sybil_keys` identities, each sending groups built to win the
  `signal` selection rule and to pass every check: half the completions are the
  answer with a trailing space (which the reward's `strip()` accepts), half a wrong
  answer, with the rewards the receiver will recompute (nothing to refuse, nobody to
  blame). It crowds peers' own groups out of the external slots and teaches a format.
  Its completions claim they never ended: under `train.foreign_trajectory = "ended"`
  (the default) none of them is trainable, so its groups are dropped on arrival
  (`no_trainable_signal`, not blamed).
- `signal_bait_ended`: the same groups, every completion claiming it ended: the bait
  adapted to the `ended` rule. Receivers then train "answer, space, EOS" (correct under
  their own reward, and ending) against a wrong answer.
- `signal_bait_farmed`: trust farming: until `attack_after_s` of virtual time after it
  joined, each of its keys re-sends honest peers' groups it was delivered (real work,
  re-signed as its own: they pass every check and earn the key trust); then it turns
  into `signal_bait_ended`.
- `offpolicy_correct`: honest-looking groups that are not the receiver's policy's:
  another model's answers (the exact answer, 2 to 6 of 8 completions, the others wrong
  numbers of the same length), every one ended, claiming what the receiver recomputes.

Invariants:
- Deterministic: every choice comes from the attacker's own seeded RNG and the messages
  it has been delivered; keys derive from the run seed.
- Attackers never train and report no rewards: run summaries keep them out of the
  honest nodes' figures.
- No torch: attackers run in stub and real-model scenarios alike.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from gossip.chunking import split
from gossip.layer import envelope_limits
from rewards.mixture import TaskStream
from rewards.registry import score_group
from rewards.tasks import make_task
from simnet.scenario import ATTACK_BEHAVIORS, HostileSpec
from swarm.codec import Limits, unpack
from swarm.config import NodeConfig
from swarm.envelope import decode_envelope, seal
from swarm.errors import WireError
from swarm.identity import Identity
from swarm.messages import (
    MAX_TEXT_CHARS,
    Chunk,
    Hello,
    RolloutBatch,
    RolloutGroup,
    TaskRef,
    decode_payload,
    encode_payload,
)
from swarm.transport import peers_topic, rollouts_topic

FORGED_REWARD = 1.0
"""The reward forged groups claim for every completion (the correctness maximum)."""
_PEEK_LIMITS = Limits(
    max_message_bytes=64 << 20,
    max_str_len=1024,
    max_bin_len=64 << 20,
    max_array_len=16,
    max_map_len=16,
    max_depth=2,
)

Publish = Callable[[str, bytes], None]


@dataclass(frozen=True)
class AttackSettings:
    behavior: str
    every_s: float
    flood_messages: int
    sybil_keys: int
    groups_per_batch: int
    attack_after_s: float = 0.0
    """`signal_bait_farmed`: virtual seconds of honest-looking work before the attack."""

    @classmethod
    def of(cls, behavior: str, spec: HostileSpec) -> AttackSettings:
        """The settings of a scenario's attacker group (`behavior`, `[nodes.hostile]`)."""
        return cls(
            behavior,
            spec.every_s,
            spec.flood_messages,
            spec.sybil_keys,
            spec.groups_per_batch,
            spec.attack_after_s,
        )


class Attacker:
    """One hostile peer (see the module docstring for the behaviours)."""

    def __init__(
        self,
        settings: AttackSettings,
        config: NodeConfig,
        identities: list[Identity],
        publish: Publish,
        rng: random.Random,
        task_seed: int,
        start_seq: int,
    ) -> None:
        if settings.behavior not in ATTACK_BEHAVIORS:
            raise ValueError(f"unknown attack behavior {settings.behavior!r}")
        if not identities:
            raise ValueError("an attacker needs at least one identity")
        self.settings = settings
        self.config = config
        self.identities = identities
        self.publish = publish
        self.rng = rng
        self.swarm_id = config.node.swarm_id
        self.rollouts = rollouts_topic(self.swarm_id)
        self.peers = peers_topic(self.swarm_id)
        self.tasks = TaskStream(config.tasks, task_seed)
        self.group_size = config.sampler.group_size
        self.max_message_bytes = config.transport.max_message_bytes
        self.sent = 0
        self._seq = start_seq
        self._recent: deque[tuple[str, bytes]] = deque(maxlen=64)
        self._old: deque[tuple[str, bytes]] = deque(maxlen=64)
        self._ticks = 0

    @property
    def behavior(self) -> str:
        return self.settings.behavior

    # ---- what it hears ---------------------------------------------------------------

    def observe(self, topic: str, data: bytes) -> None:
        """A message delivered to the attacker: keep what looks like an envelope for replays."""
        try:
            fields = unpack(data, _PEEK_LIMITS)
        except WireError:
            return  # someone else's junk: nothing to replay
        if not (isinstance(fields, list) and len(fields) == 8):
            return
        if len(self._recent) == self._recent.maxlen:
            self._old.append(self._recent[0])
        self._recent.append((topic, data))

    # ---- what it sends ---------------------------------------------------------------

    def tick(self) -> None:
        """Send one tick's worth of this behaviour."""
        getattr(self, f"_tick_{self.behavior}")()

    def _send(self, topic: str, data: bytes) -> None:
        self.publish(topic, data)
        self.sent += 1

    def _sealed(
        self,
        identity: Identity,
        kind: str,
        payload: bytes,
        *,
        policy_version: int = 0,
        swarm_id: str | None = None,
    ) -> bytes:
        self._seq += 1
        return seal(
            identity,
            kind=kind,
            swarm_id=swarm_id or self.swarm_id,
            seq=self._seq,
            policy_version=policy_version,
            payload=payload,
        ).encode()

    def _tasks(self) -> list[TaskRef]:
        return self.tasks.next_refs(self.settings.groups_per_batch)

    def _group(
        self, ref: TaskRef, prompt: str, completions: list[str], rewards: list[float]
    ) -> RolloutGroup:
        return RolloutGroup(ref, prompt, tuple(completions), tuple(rewards), "attacker", 0)

    def _honest_looking_groups(self) -> list[RolloutGroup]:
        groups = []
        for ref in self._tasks():
            task = make_task(ref)
            completions = [
                task.answer if self.rng.random() < 0.5 else task.answer + "0"
                for _ in range(self.group_size)
            ]
            rewards = [1.0 if c == task.answer else 0.0 for c in completions]
            groups.append(self._group(ref, task.prompt, completions, rewards))
        return groups

    def _forged_groups(self) -> list[RolloutGroup]:
        groups = []
        for ref in self._tasks():
            task = make_task(ref)
            dodges = ("no idea", "I cannot say", "hard to tell", "let me think")
            wrong = [self.rng.choice(dodges) for _ in range(self.group_size - 1)]
            completions = [task.answer, *wrong]
            groups.append(
                self._group(ref, task.prompt, completions, [FORGED_REWARD] * self.group_size)
            )
        return groups

    def _batch(self, groups: list[RolloutGroup]) -> bytes:
        return encode_payload(RolloutBatch(tuple(groups)))

    def _tick_garbage(self) -> None:
        rng = self.rng
        self._send(self.rollouts, rng.randbytes(rng.randrange(1, 4096)))
        junk = [rng.randrange(-(2**40), 2**40) for _ in range(8)]
        shaped = bytes([0x98]) + b"".join(  # a msgpack array of 8 int64s: not an envelope
            bytes([0xD3]) + (v % 2**64).to_bytes(8, "big") for v in junk
        )
        self._send(self.peers, shaped)
        oversize = self.max_message_bytes + rng.randrange(4096, 65536)  # past any margin
        self._send(self.rollouts, rng.randbytes(oversize))

    def _tick_wrong_swarm(self) -> None:
        batch = self._batch(self._honest_looking_groups())
        self._send(
            self.rollouts,
            self._sealed(self.identities[0], "rollouts", batch, swarm_id=f"{self.swarm_id}-x"),
        )

    def _tick_replay(self) -> None:
        pool = list(self._recent) + list(self._old)
        for _ in range(min(8, len(pool))):
            topic, data = pool[self.rng.randrange(len(pool))]
            self._send(topic, data)

    def _tick_flood(self) -> None:
        hello = encode_payload(Hello("attacker", "attacker", 0, ()))
        for _ in range(self.settings.flood_messages):
            self._send(self.peers, self._sealed(self.identities[0], "hello", hello))

    def _tick_mismatched_prompt(self) -> None:
        groups = []
        for ref in self._tasks():
            task = make_task(ref)
            other = make_task(TaskRef(ref.source, ref.seed, ref.index + 1))
            completions = [task.answer] * (self.group_size - 1) + [task.answer + "0"]
            rewards = [1.0] * (self.group_size - 1) + [0.0]
            groups.append(self._group(ref, other.prompt, completions, rewards))
        self._send(self.rollouts, self._sealed(self.identities[0], "rollouts", self._batch(groups)))

    def _tick_forged_rewards(self) -> None:
        batch = self._batch(self._forged_groups())
        self._send(self.rollouts, self._sealed(self.identities[0], "rollouts", batch))

    def _tick_sybil(self) -> None:
        # Claims of absurd policy versions (the old clock-ratchet attack): with staleness
        # measured by each receiver, they can only make the claimant's own groups stale.
        claim = 2**62
        hello = encode_payload(Hello("attacker", "attacker", claim, ()))
        for identity in self.identities:
            self._send(self.peers, self._sealed(identity, "hello", hello, policy_version=claim))
            batch = self._batch(self._forged_groups())
            self._send(self.rollouts, self._sealed(identity, "rollouts", batch))

    def _tick_signal_bait(self, ended: bool = False) -> None:
        for identity in self.identities:
            groups = []
            for ref in self._tasks():
                task = make_task(ref)
                half = self.group_size // 2
                completions = [task.answer + " "] * half + [task.answer + "0"] * (
                    self.group_size - half
                )
                rewards = score_group(task, completions, self.config.rewards)
                group = self._group(ref, task.prompt, completions, rewards)
                if ended:
                    group = replace(group, finished=(True,) * len(completions))
                groups.append(group)
            self._send(self.rollouts, self._sealed(identity, "rollouts", self._batch(groups)))

    def _tick_signal_bait_ended(self) -> None:
        self._tick_signal_bait(ended=True)

    def _tick_signal_bait_farmed(self) -> None:
        self._ticks += 1
        if (self._ticks - 1) * self.settings.every_s >= self.settings.attack_after_s:
            self._tick_signal_bait(ended=True)
            return
        honest = self._observed_groups()
        if not honest:
            return
        for identity in self.identities:
            count = self.settings.groups_per_batch
            picks = [honest[self.rng.randrange(len(honest))] for _ in range(count)]
            self._send(self.rollouts, self._sealed(identity, "rollouts", self._batch(picks)))

    def _observed_groups(self) -> list[RolloutGroup]:
        """Groups of the honest rollout batches recently delivered to the attacker."""
        limits = envelope_limits(self.max_message_bytes)
        groups: list[RolloutGroup] = []
        for topic, data in self._recent:
            if topic != self.rollouts:
                continue
            try:
                envelope = decode_envelope(data, limits, self.swarm_id)
                payload = decode_payload(envelope.kind, envelope.payload, limits)
            except WireError:
                continue  # chunks, other attackers' junk: nothing to farm
            if isinstance(payload, RolloutBatch):
                groups.extend(payload.groups)
        return groups

    def _tick_offpolicy_correct(self) -> None:
        for identity in self.identities:
            groups = []
            for ref in self._tasks():
                task = make_task(ref)
                right = self.rng.randint(2, 6) * self.group_size // 8
                width = max(len(task.answer), 1)
                low = 10 ** (width - 1) if width > 1 else 0
                wrong = []
                while len(wrong) < self.group_size - right:
                    guess = str(self.rng.randrange(low, 10**width))
                    if guess != task.answer:
                        wrong.append(guess)
                completions = [task.answer] * right + wrong
                self.rng.shuffle(completions)
                rewards = score_group(task, completions, self.config.rewards)
                group = replace(
                    self._group(ref, task.prompt, completions, rewards),
                    finished=(True,) * len(completions),
                )
                groups.append(group)
            self._send(self.rollouts, self._sealed(identity, "rollouts", self._batch(groups)))

    def _tick_silent_mid_chunk(self) -> None:
        identity = self.identities[0]
        groups = self._honest_looking_groups()
        per_text = 3 * self.max_message_bytes // max(len(groups) * self.group_size, 1)
        filler = "a" * min(per_text, MAX_TEXT_CHARS - 64)
        padded = [
            self._group(g.task, g.prompt, [c + filler for c in g.completions], list(g.rewards))
            for g in groups
        ]
        whole = self._sealed(identity, "rollouts", self._batch(padded))
        # At least 4 chunks whatever the size, so that half of them is never the whole.
        chunk_data = min(self.max_message_bytes - 512, len(whole) // 4 + 1)
        # The set never completes, so any 32-byte name does (the real one: its signing digest).
        chunks = split(whole, chunk_data, hashlib.sha256(whole).digest())
        for chunk in chunks[: max(1, len(chunks) // 2)]:
            self._send(self.rollouts, self._sealed(identity, Chunk.KIND, encode_payload(chunk)))
