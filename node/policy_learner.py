"""The production `Learner`: a real policy model, its sampler and its GRPO trainer.

Invariants:
- Prompts on the wire are the task's raw question; this learner renders them for its own
  model with one `PromptRenderer` (`[prompt]` config) shared by sampler and trainer.
- torch's CPU threads are set from `model.threads` before the model loads.
- After every optimizer step the sampler gets the new weights before the next sample.
- Checkpoints go through `policy.checkpoint` (atomic) with the node's manifest inside.
"""

from __future__ import annotations

import copy
import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from node.choco_deltas import ChocoExchange
from node.deltas import DeltaExchange, model_params
from node.learner import EvalResult, ExternalGroup, LocalGroup, SampleResult, TrainResult
from node.ranked_sampler import RankedSampler, launcher_env
from node.ranks import Command, TrainingRanks, threads_per_rank
from node.rescore import Refused
from node.trainable import load_trainable
from policy.checkpoint import (
    capture_checkpoint,
    load_checkpoint,
    restore_rng_state,
    rng_state_tensors,
    write_checkpoint,
)
from policy.loading import resolve_device
from policy.parallel import optimizer_state_by_index, optimizer_state_by_name
from policy.precision import configure_threads
from policy.sampler import Sampler, SamplingParams, make_sampler, stop_token_ids
from policy.tiny import BUILTIN_PREFIX
from policy.trainer import TrainGroup
from rewards.registry import (
    best_constant,
    build_tasks,
    canonical_completion,
    correctness,
    extract_answer,
    resolve_answer_format,
    score_group,
)
from rewards.tasks import Task
from swarm.config import NodeConfig
from swarm.errors import RanksFailed
from swarm.messages import DeltaPacket, TaskRef


class PolicyLearner:
    def __init__(self, config: NodeConfig) -> None:
        self.threads = configure_threads(
            threads_per_rank(config, resolve_device(config.model.device)),
            config.model.name_or_path.startswith(BUILTIN_PREFIX),
        )
        self.ranks: TrainingRanks | None = None
        """The node's other training ranks (`train.ranks` > 1), started here."""
        info = None
        if config.train.ranks > 1:
            self.ranks = TrainingRanks(config, resolve_device(config.model.device))
            info = self.ranks.info
        try:
            built = load_trainable(config, info)
        except RuntimeError as exc:  # a rank failed while the engine started
            if self.ranks is None:
                raise
            reason = self.ranks.why_failed(exc)
            self.ranks.close(grace_s=1.0)
            raise RanksFailed(reason) from exc
        except BaseException:
            if self.ranks is not None:
                self.ranks.close(grace_s=1.0)
            raise
        self.trainer = built.trainer
        self.sharded = built.whole is not None
        """FSDP: the trainer holds shards; `model` is rank 0's whole copy, refreshed after
        each step (sampling, deltas and checkpoints use it)."""
        self.model = built.whole if self.sharded else built.model
        self.tokenizer = built.tokenizer
        self._checkpoint_optimizer = self.trainer.optimizer
        """The optimizer checkpoints save and load: the trainer's own, or under FSDP one of
        the whole model's, filled with the gathered state before each save."""
        if self.sharded:  # the trainer's hyperparameters: a checkpoint saves its groups
            self._checkpoint_optimizer = torch.optim.AdamW(
                [p for p in self.model.parameters() if p.requires_grad],
                lr=config.train.learning_rate,
                weight_decay=config.train.weight_decay,
            )
        self.model_id = config.model.name_or_path
        self.model_family = built.model_family
        self.lora = built.lora
        """The adapter settings of a LoRA node (None: full fine-tuning)."""
        self.device = built.device
        self.renderer = built.renderer
        # Overlapped sampling reads weights while training writes them: the transformers
        # sampler then gets its own copy (vLLM always has one), refreshed under the lock.
        self.sample_overlap = config.sampler.overlap
        """Whether the node samples the next round while this one trains."""
        own_copy = self.sample_overlap and config.sampler.backend == "transformers"
        sampler_model = copy.deepcopy(self.model).requires_grad_(False) if own_copy else self.model
        self.on_every_rank = config.samples_on_every_rank()
        """Each training rank samples a share (`node.ranked_sampler`)."""
        if self.on_every_rank:
            launcher_env(0, 0, config.train.ranks)
        self.sampler: Sampler = make_sampler(
            config.sampler,
            sampler_model,
            self.tokenizer,
            config.model,
            self.renderer,
            on_ranks=self.on_every_rank,
        )
        if self.on_every_rank:
            assert self.ranks is not None
            tp = config.sampler.vllm_tensor_parallel_size if config.sampler.backend == "vllm" else 1
            ranked = RankedSampler(self.sampler, self.ranks, tp)
            self.ranks.before_leaving = ranked.release_process_groups
            self.sampler = ranked
        self._sampler_lock = threading.Lock()
        """Held while the sampler generates or takes new weights (never both at once)."""
        self._sampler_version = self.policy_version
        self._constants: dict[tuple[TaskRef, ...], tuple[str, float]] = {}
        """Each held-out set's best constant answer (`best_constant`): the sets are fixed
        for the node's life, so it is scored once (64 answers x every task)."""
        self.params = SamplingParams.from_config(config.sampler)
        self.stop_ids = frozenset(stop_token_ids(self.model, self.tokenizer))
        self.group_size = config.sampler.group_size
        self.save_optimizer = config.node.checkpoint_optimizer
        self.peer_stops = config.train.foreign_trajectory != "text" or config.train.foreign_eos
        """Whether the trainer needs peers' `finished` bits, and their logprobs with the
        stop token's (it drops that one where it does not train the stop token)."""
        self.canonical_peer_text = config.train.foreign_text == "canonical"
        self.rewards_config = resolve_answer_format(config.rewards, self.renderer.mode == "chat")
        """The rewards config with `answer_format` resolved for this model's prompts (the
        node re-scores peers' groups with the same)."""
        exchange = ChocoExchange if config.deltas.scheme == "choco" else DeltaExchange
        self.deltas: DeltaExchange | ChocoExchange | None = (
            exchange(
                config.deltas, self.model_family, model_params(self.model), self.policy_version
            )
            if config.deltas.enabled
            else None
        )

    @property
    def policy_version(self) -> int:
        return self.trainer.policy_version

    def _sync_sampler(self) -> None:
        """The trainer's weights into the sampler, between generation batches."""
        weights = (
            {k: v.detach() for k, v in self.model.state_dict().items()}
            if self.sharded
            else self.trainer.state_dict_for_sampler()
        )
        with self._sampler_lock:
            self.sampler.update_weights(weights)
            self._sampler_version = self.policy_version

    def sample(self, refs: list[TaskRef], seed: int) -> SampleResult:
        tasks, skipped = build_tasks(refs, self.rewards_config)
        start = time.perf_counter()
        prompts = [self.renderer.ids(t.prompt, t.ref.source) for t in tasks]
        with self._sampler_lock:
            version = self._sampler_version
            outputs = self.sampler.generate(prompts, self.group_size, self.params, seed=seed)
        sampled = time.perf_counter()
        groups = []
        for task, completions in zip(tasks, outputs, strict=True):
            texts = [c.text for c in completions]
            rewards = score_group(task, texts, self.rewards_config)
            groups.append(
                LocalGroup(
                    ref=task.ref,
                    prompt=task.prompt,
                    completions=tuple(texts),
                    rewards=tuple(rewards),
                    token_ids=tuple(tuple(c.token_ids) for c in completions),
                    sampler_logprobs=tuple(tuple(c.logprobs) for c in completions),
                    finished=tuple(
                        bool(c.token_ids) and c.token_ids[-1] in self.stop_ids for c in completions
                    ),
                )
            )
        return SampleResult(
            groups, sampled - start, time.perf_counter() - sampled, version, dict(skipped)
        )

    def evaluate(self, refs: list[TaskRef], max_new_tokens: int, samples: int = 0) -> EvalResult:
        start = time.perf_counter()
        tasks, skipped = build_tasks(refs, self.rewards_config)
        params = SamplingParams(max_new_tokens, self.params.temperature, self.params.top_p)
        if samples == 0:
            params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
        prompts = [self.renderer.ids(t.prompt, t.ref.source) for t in tasks]
        with self._sampler_lock:
            outputs = self.sampler.generate(prompts, max(samples, 1), params, seed=0)
        scores = [
            correctness(task, c.text, self.rewards_config)
            for task, completions in zip(tasks, outputs, strict=True)
            for c in completions
        ]
        ended = [
            bool(c.token_ids) and c.token_ids[-1] in self.stop_ids for cs in outputs for c in cs
        ]
        return EvalResult(
            accuracy=sum(scores) / max(len(scores), 1),
            n=len(scores),
            seconds=time.perf_counter() - start,
            finished=sum(ended) / max(len(ended), 1),
            answers=tuple(extract_answer(c.text) for cs in outputs for c in cs),
            golds=tuple(t.answer for t in tasks),
            constant=self._constant(tasks),
            skipped=sum(skipped.values()),
        )

    def _constant(self, tasks: list[Task]) -> tuple[str, float] | None:
        key = tuple(t.ref for t in tasks)
        if key not in self._constants:
            found = best_constant(tasks, self.rewards_config)
            if found is None:  # ran out of time: unknown this time, tried again next
                return None
            self._constants[key] = found
        return self._constants[key]

    def train(self, local: list[LocalGroup], external: list[ExternalGroup]) -> TrainResult:
        start = time.perf_counter()
        groups = [
            TrainGroup(
                prompt=g.prompt,
                completions=list(g.completions),
                rewards=list(g.rewards),
                completion_token_ids=[list(t) for t in g.token_ids] if g.token_ids else None,
                sampler_logprobs=[list(lp) for lp in g.sampler_logprobs]
                if g.sampler_logprobs
                else None,
                local=True,
                prompt_ids=self.renderer.ids(g.prompt, g.ref.source),
            )
            for g in local
        ] + [
            TrainGroup(
                prompt=e.prompt,
                completions=self._peer_texts(e),
                rewards=list(e.rewards),
                finished=list(e.finished) if e.finished and self.peer_stops else None,
                sampler_logprobs=self._peer_logprobs(e),
                peer_token_ids=self._peer_token_ids(e),
                local=False,
                prompt_ids=self.renderer.ids(e.prompt, e.source),
            )
            for e in external
        ]
        if self.ranks is not None:
            stats = self.ranks.run(Command("step", groups), lambda: self._step_on_ranks(groups))
        else:
            stats = self.trainer.step(groups)
        self._sync_sampler()
        return TrainResult(stats.as_dict(), time.perf_counter() - start)

    def _peer_texts(self, e: ExternalGroup) -> list[str]:
        """A peer's completions as the trainer sees them (`train.foreign_text`): in the form
        our reward reads (same rewards, nothing the reward ignores), or as sent."""
        if self.canonical_peer_text:
            return [canonical_completion(c) for c in e.completions]
        return list(e.completions)

    def _peer_logprobs(self, e: ExternalGroup) -> list[list[float]] | None:
        """A peer's sampler logprobs for the trainer: only from a peer of our model family
        (our tokenizer and base), and without the stop token's where the trainer appends
        no EOS (`foreign_trajectory = "text"` with `foreign_eos` off), so they line up
        with the tokens it trains."""
        if not e.sampler_logprobs or e.model_family != self.model_family:
            return None
        ended = e.finished or (False,) * len(e.completions)
        trained = self._peer_texts(e)
        return [
            # The peer's logprobs describe the text it sent: none for a text we changed
            # (the trainer then counts a mismatch and applies the foreign rule).
            []
            if text != sent
            else list(lp[:-1])
            if done and lp and not self.peer_stops
            else list(lp)
            for lp, done, text, sent in zip(
                e.sampler_logprobs, ended, trained, e.completions, strict=True
            )
        ]

    def _peer_token_ids(self, e: ExternalGroup) -> list[list[int] | None] | None:
        """The ids a peer of our model family sampled, per completion, without its stop
        token (the trainer appends ours), None for a text we changed (`foreign_text`):
        the trainer still checks they decode to the text (`train.peer_tokens`)."""
        if not e.token_ids or e.model_family != self.model_family:
            return None
        ended = e.finished or (False,) * len(e.completions)
        trained = self._peer_texts(e)
        rows = zip(e.token_ids, ended, trained, e.completions, strict=True)
        return [
            None if text != sent else list(ids[:-1] if done and ids else ids)
            for ids, done, text, sent in rows
        ]

    def receive_delta(
        self, sender: str, sender_version: int, packet: DeltaPacket, arrival_round: int
    ) -> None:
        if self.deltas is None:
            raise Refused("deltas_disabled")
        self.deltas.receive(sender, sender_version, packet, arrival_round)

    def share_deltas(self, own_round: int) -> tuple[DeltaPacket | None, dict[str, Any] | None]:
        if self.deltas is None or not self.deltas.due(self.policy_version):
            return None, None
        params = model_params(self.model)
        packet = self.deltas.maybe_make_packet(self.policy_version, params)
        stats = self.deltas.merge_into(params, own_round)
        if stats.applied_norm > 0:
            self._weights_to_ranks()
            self._sync_sampler()
        return packet, {**stats.as_dict(), "bytes_out": len(packet.tensors) if packet else 0}

    def capture(self, directory: Path, manifest: dict[str, Any]) -> Callable[[], None]:
        if self.save_optimizer and self.trainer.policy_version > 0:
            self._gather_optimizer()  # (no state before the first step: nothing to gather)
        rng = rng_state_tensors()
        if self.deltas is not None:
            rng.update({"deltas/" + k: v for k, v in self.deltas.state_tensors().items()})
        image = capture_checkpoint(
            directory,
            self.model,
            self._checkpoint_optimizer if self.save_optimizer else None,
            rng,
            {**manifest, "policy_version": self.policy_version},
            tokenizer=self.tokenizer,
            lora=self.lora,
        )
        return functools.partial(write_checkpoint, image)

    def save(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.capture(directory, manifest)()

    def load(self, directory: Path) -> dict[str, Any]:
        manifest, extra = load_checkpoint(directory, self.model, self._checkpoint_optimizer)
        restore_rng_state(extra)
        if self.deltas is not None:
            state = {
                k.removeprefix("deltas/"): v for k, v in extra.items() if k.startswith("deltas/")
            }
            if state:
                self.deltas.load_state_tensors(state)
            else:
                self.deltas.rebase(model_params(self.model), self.policy_version)
        self.trainer.policy_version = int(manifest["policy_version"])
        if self.ranks is not None:
            self._load_on_ranks()
        self._sync_sampler()
        return manifest

    def _step_on_ranks(self, groups: list[TrainGroup]) -> Any:
        """Rank 0's side of a `step` command (`node.rank_worker` runs the others')."""
        stats = self.trainer.step(groups)
        if self.sharded:
            assert self.trainer.parallel is not None
            gathered = self.trainer.parallel.gathered_state_dict(everywhere=self.on_every_rank)
            self.model.load_state_dict(gathered)
        return stats

    def _replicas_gather(self) -> None:
        """FSDP with a sampler on every rank: rank 0's side of the gather that refreshes
        the other ranks' samplers after their weights were loaded (rank 0 has them)."""
        if self.sharded and self.on_every_rank:
            assert self.trainer.parallel is not None
            self.trainer.parallel.gathered_state_dict(everywhere=True)

    def _weights_to_ranks(self) -> None:
        """Rank 0's weights, changed outside a training step (a merge), to the other ranks."""
        if self.ranks is not None and self.trainer.parallel is not None:
            parallel = self.trainer.parallel
            state = self.model.state_dict() if self.sharded else None

            def sync() -> None:
                parallel.load_full_state_dict(state)
                self._replicas_gather()

            self.ranks.run(Command("sync"), sync)

    def _trainable_names(self) -> list[str]:
        return [n for n, p in self.model.named_parameters() if p.requires_grad]

    def _gather_optimizer(self) -> None:
        """FSDP: the trainer's sharded optimizer state into the whole-model optimizer that
        checkpoints save (a collective of every rank)."""
        if not self.sharded or self.ranks is None:
            return
        parallel = self.trainer.parallel
        assert parallel is not None
        optimizer = self.trainer.optimizer
        state = self.ranks.run(
            Command("gather_optimizer"), lambda: parallel.gathered_optimizer_state(optimizer)
        )
        self._checkpoint_optimizer.load_state_dict(
            optimizer_state_by_index(state, self._trainable_names())
        )

    def _load_on_ranks(self) -> None:
        """Rank 0's restored weights, optimizer state and policy version to every rank."""
        assert self.ranks is not None and self.trainer.parallel is not None
        parallel, optimizer = self.trainer.parallel, self.trainer.optimizer
        saved = self._checkpoint_optimizer.state_dict() if self.save_optimizer else None
        if saved is not None and not saved["state"]:
            saved = None  # saved before any step: the optimizer starts fresh
        if not self.sharded:  # DDP: every rank's optimizer holds rank 0's whole state
            payload = (saved, self.policy_version, False)
            self.ranks.run(Command("load", payload), lambda: parallel.load_full_state_dict(None))
            return  # (DDP: the other ranks' samplers read their replicas, no gather)
        by_name = optimizer_state_by_name(saved, self._trainable_names()) if saved else None
        weights = self.model.state_dict()

        def load() -> None:
            parallel.load_full_state_dict(weights)
            if by_name is not None:
                parallel.load_optimizer_state(optimizer, by_name)
            self._replicas_gather()

        self.ranks.run(Command("load", (None, self.policy_version, by_name is not None)), load)

    def close(self) -> None:
        """Stops the node's other training ranks, if any (after the last step)."""
        if self.ranks is not None:
            self.ranks.close()
