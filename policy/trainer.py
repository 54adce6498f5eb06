"""One GRPO optimizer step over a batch of rollout groups, local and foreign.

Per step:
1. Rows (`policy.train_rows` states their invariants): degenerate groups skipped, advantages
   (larger groups weighted down to the local size), token ids (peers' texts re-tokenized
   per `foreign_trajectory`), each peer row's treatment (`peer_offpolicy`, `foreign_rule`).
2. Old logprobs are the trainer's own logprobs of those tokens under the current policy,
   detached (the PPO ratio starts at 1). At `num_iterations = 1` they are the update
   pass's own (the weights have not moved yet), so no separate pass runs; over several
   iterations (or on the plain path) a no-grad pass computes them before the update. For local
   completions with sampler logprobs, truncated importance weights
   min(exp(old - sampler), importance_cap) correct the sampler/trainer mismatch
   (a different backend, or samples from an older policy version): AReaL's decoupled
   objective, old = the proximal policy, sampler = the behaviour policy. Peer rows: TIS on
   the peer's logprobs, else weight 1, or 0 if `check_plausible` and below `min_mean_logprob`.
3. `num_iterations` optimizer steps on the configured loss (`policy.losses.LOSSES`),
   gradients accumulated over micro-batches (`micro_batch_size` sequences each, a group's
   sequences together where they fit) with the whole step's normalizers, clipped to
   `max_grad_norm`, at the learning rate
   `policy.precision.lr_factor(policy_version)` x `learning_rate`. `policy_version`
   increments per optimizer step; a batch with nothing to train takes no step.

Compute: logprobs come from `policy.token_logprobs` (each group's prompt computed once
with its completions packed against it, the LM head only at trained positions; the plain
forward where that path was not verified on the model). Each micro-batch's loss is a sum
(unit normalizers) and the accumulated gradient is divided by the step's normalizer
(`policy.losses.loss_normalizer`) once all micro-batches are in: the same gradient, and
it lets the plausibility rule decide inside the update pass.

Numerics: forwards run in `compute_context` (autocast to the compute dtype over float32
master weights; see `policy.precision`). With gradient checkpointing on, the gradient
forwards run in train mode with every `Dropout` module in eval mode (HF models checkpoint
only in train mode), so they compute the same function as the no-grad forwards.

Invariants: logprobs use `log_softmax(logits / temperature)` with the sampler's
temperature (as the sampler reports them); every forward runs in eval mode (dropout off,
so old and new logprobs agree exactly at the first iteration); the reference policy for
`beta > 0` is a frozen copy of the model as it was when the trainer was built (across
ranks rank 0's, sharded under FSDP), or, for LoRA, the base: the same model with its
adapters off (what zero-initialized adapters start from), without a second copy
(`policy.kl_reference`).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Any

import torch

from policy.kl_reference import KLReference
from policy.losses import LOSSES, loss_normalizer
from policy.micro_batches import micro_batches
from policy.offpolicy import plausible, tis_or_one
from policy.parallel import ParallelModel, RankInfo, assign_micro_batches, clip_grad_norm
from policy.precision import lr_factor
from policy.prompts import PromptRenderer
from policy.rank_counters import computed_across_ranks, left_out_across_ranks
from policy.sampler import pad_token_id, stop_token_ids
from policy.token_logprobs import TokenLogprobs
from policy.train_rows import Row as _Row  # the name the distributed parts below use
from policy.train_rows import RowBuilder
from policy.train_types import StepStats, TrainGroup
from swarm.config.learning import SamplerConfig, TrainConfig


def _train_mode_without_dropout(model: torch.nn.Module) -> None:
    """Train mode (so HF gradient checkpointing is active) with dropout still off."""
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.eval()


class Trainer:
    """Owns the optimizer; steps the policy on batches of `TrainGroup`s.

    Pass the node's `sampler_config`: the trainer takes the sampling temperature from it
    (logprobs must be of the distribution that was sampled) and `max_new_tokens` as Dr.
    GRPO's constant normalizer. Without it: temperature 1 and the step's longest
    completion (the same for every micro-batch). `policy_version` is the count of
    optimizer steps; set it after restoring a checkpoint.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        train_config: TrainConfig,
        device: torch.device | str | None = None,
        sampler_config: SamplerConfig | None = None,
        renderer: PromptRenderer | None = None,
        compute_dtype: torch.dtype | None = None,
        packed: bool = True,
        ranks: RankInfo | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else model.device
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.renderer = renderer if renderer is not None else PromptRenderer(tokenizer)
        self.param_dtype = next(model.parameters()).dtype
        self.compute_dtype = compute_dtype if compute_dtype is not None else self.param_dtype
        self.config = train_config
        self.temperature = sampler_config.temperature if sampler_config is not None else 1.0
        self.max_completion_length = (
            sampler_config.max_new_tokens if sampler_config is not None else None
        )
        self.loss_fn = LOSSES[train_config.loss_type]
        self.reference = KLReference(model, train_config.beta)
        """The KL reference (`policy.kl_reference`): none, the LoRA base, or a copy (made
        here, before the engine below shards the model)."""
        eos = stop_token_ids(model, tokenizer)
        self.eos_id = (
            tokenizer.eos_token_id if tokenizer.eos_token_id is not None else min(eos, default=None)
        )
        group_size = sampler_config.group_size if sampler_config is not None else None
        budget = self.max_completion_length
        self.row_builder = RowBuilder(
            train_config, group_size, self.renderer, tokenizer, self.eos_id, budget
        )
        self.policy_version = 0
        self.token_logprobs = TokenLogprobs(
            self.model,
            self.device,
            self.compute_dtype,
            self.param_dtype,
            self.temperature,
            pad_token_id(tokenizer, eos),
            packed=packed,
        )
        """Logprobs of completions: shared-prefix packed where verified on this model
        (`fallback_reason` says why not), else the plain forward."""
        self.parallel = (
            ParallelModel(self.model, ranks) if ranks is not None and ranks.world > 1 else None
        )
        """The engine (DDP / FSDP) across this node's ranks; None: one process. Made before
        the optimizer, which must hold FSDP's sharded parameters."""
        if self.parallel is not None:
            self.reference.join(self.parallel)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=train_config.learning_rate,
            weight_decay=train_config.weight_decay,
        )
        self._tokens_computed = 0
        self._padding_tokens = 0
        self._group_lp: defaultdict[int, list[float]] = defaultdict(lambda: [0.0, 0])
        """Per group index of the current step: [sum of trained tokens' logprobs, tokens]."""

    @property
    def group_size(self) -> int | None:
        """The local group size G that larger groups are weighted down to (None: none)."""
        return self.row_builder.group_size

    @group_size.setter
    def group_size(self, value: int | None) -> None:
        self.row_builder.group_size = value

    def state_dict_for_sampler(self) -> dict[str, torch.Tensor]:
        """The current weights (detached references, not copies) for `Sampler.update_weights`."""
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def _rows(self, group: TrainGroup, stats: StepStats | None = None) -> list[_Row]:
        """One group's rows (`policy.train_rows`)."""
        return self.row_builder.rows(group, stats)

    def _rows_of(self, groups: list[TrainGroup], stats: StepStats) -> list[_Row]:
        """The step's rows, each with its group's index (`policy.train_rows`)."""
        return self.row_builder.rows_of(groups, stats)

    def _logprobs(
        self, model: Any, rows: list[_Row], entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(completion logprobs [B, T], mask [B, T], with `entropy` the policy's entropy
        at each completion position [B, T], else None) of `rows` under `model`."""
        lp, mask, entropies = self.token_logprobs(
            model, [(r.ids[: r.start], r.ids[r.start :]) for r in rows], entropy
        )
        self._tokens_computed += self.token_logprobs.last_tokens_computed
        self._padding_tokens += round(
            self.token_logprobs.last_padding_share * self.token_logprobs.last_tokens_computed
        )
        return lp, mask, entropies

    def _no_grad_logprobs(self, micro: list[list[_Row]], n_empty: int) -> list[torch.Tensor]:
        out = []
        with torch.no_grad():
            for mb in micro:
                if self.parallel is None:
                    lp, _, _ = self._logprobs(self.model, mb)
                else:
                    lp, _, _ = self.parallel.plain_compute(lambda m, mb=mb: self._logprobs(m, mb))
                out.append(lp)
            if self.parallel is not None and self.parallel.info.kind == "fsdp":
                for _ in range(n_empty):
                    self._empty_pass(grad=False)
        return out

    def _my_share(self, micro: list[list[_Row]]) -> tuple[list[list[_Row]], int, int]:
        """(this rank's micro-batches, empty passes it runs beside them in a gradient
        pass, and in a no-grad pass): see `policy.parallel`'s invariants."""
        if self.parallel is None:
            return micro, 0, 0
        world = self.parallel.world
        owner = assign_micro_batches([sum(len(r.ids) for r in mb) for mb in micro], world)
        rank = self.parallel.info.rank
        mine = [mb for mb, owner_rank in zip(micro, owner, strict=True) if owner_rank == rank]
        if self.parallel.info.kind == "ddp":
            return mine, 0 if mine else 1, 0
        most = max((owner.count(r) for r in range(world)), default=0)
        n_empty = max(most, 1) - len(mine)
        return mine, n_empty, most - len(mine)

    def _empty_pass(self, grad: bool) -> None:
        """One token through the engine with zero loss: keeps a rank with less work in step
        with the others' collectives (see `policy.parallel`)."""
        assert self.parallel is not None
        one = [([self.token_logprobs.pad_id], [self.token_logprobs.pad_id])]
        lp, _, _ = self.parallel.compute(lambda m: self.token_logprobs(m, one))
        if grad:
            # As `_micro_loss`: a reference forward between the forward and the backward.
            self.reference.logprobs(lambda m: self.token_logprobs(m, one)[0])
            (lp.sum() * 0.0).backward()

    def _sum_across_ranks(self, values: list[float]) -> list[float]:
        return values if self.parallel is None else self.parallel.sum(values)

    def _sync(self, sync: bool) -> Any:
        if self.parallel is None:
            return contextlib.nullcontext()
        return self.parallel.gradient_sync(sync)

    def _micro_weights(
        self, mb: list[_Row], old_lp: torch.Tensor, stats: StepStats, sums: dict[bool, list]
    ) -> tuple[torch.Tensor | None, int, int]:
        """One micro-batch's token weights (None: all 1), and the rows and tokens the
        plausibility rule left out; adds to the plausibility counters and to `sums`
        (peer? -> [weight sum, tokens]) for the weight means."""
        t = old_lp.shape[1]
        lengths = torch.tensor([len(r.ids) - r.start for r in mb], device=self.device)
        valid = torch.arange(t, device=self.device)[None] < lengths[:, None]
        masked = torch.where(valid, old_lp.detach().float(), 0.0)  # padding may be -inf
        row_sums = masked.sum(-1).tolist()
        for row, total, n in zip(mb, row_sums, lengths.tolist(), strict=True):
            self._group_lp[row.group][0] += total
            self._group_lp[row.group][1] += n
        w = None
        if any(r.sampler_logprobs is not None for r in mb):
            lps = [r.sampler_logprobs for r in mb]
            w = tis_or_one(old_lp, lps, valid, self.config.importance_cap)
            for i, r in enumerate(mb):
                if r.sampler_logprobs is not None:
                    sums[r.peer][0] += float(w[i][valid[i]].sum())
                    sums[r.peer][1] += int(valid[i].sum())
        left_out, left_out_tokens = 0, 0
        check = torch.tensor([r.check_plausible for r in mb], device=self.device)
        if bool(check.any()):
            ok = plausible(old_lp, valid, self.config.min_mean_logprob)
            drop = check & ~ok
            stats.n_peer_plausible += int((check & ok).sum())
            stats.n_peer_implausible += int(drop.sum())
            left_out += int(drop.sum())
            left_out_tokens += int(lengths[drop].sum())
            if bool(drop.any()):
                w = w if w is not None else torch.ones_like(old_lp)
                w = w * (~drop).to(w.dtype)[:, None]
        return w, left_out, left_out_tokens

    @staticmethod
    def _weight_means(sums: dict[bool, list], stats: StepStats) -> None:
        for peer, (total, n) in sums.items():
            mean = total / n if n else 1.0
            if peer:
                stats.peer_weight_mean = mean
            else:
                stats.importance_weight_mean = mean

    def step(self, groups: list[TrainGroup]) -> StepStats:
        """One batch: `num_iterations` optimizer steps (none if nothing to train)."""
        return self._run(groups, apply=True)[0]

    def loss_and_gradients(
        self, groups: list[TrainGroup]
    ) -> tuple[StepStats, dict[str, torch.Tensor]]:
        """The first iteration's loss and gradients (by parameter name) without stepping:
        what `step` would apply. For tests comparing computation paths."""
        return self._run(groups, apply=False)

    def _run(
        self, groups: list[TrainGroup], apply: bool
    ) -> tuple[StepStats, dict[str, torch.Tensor]]:
        started = time.perf_counter()
        all_rewards = [r for g in groups for r in g.rewards]
        stats = StepStats(
            reward_mean=sum(all_rewards) / len(all_rewards) if all_rewards else 0.0,
            policy_version=self.policy_version,
        )
        rows = self._rows_of(groups, stats)
        stats.timings["prepare"] = time.perf_counter() - started
        if not rows:
            stats.seconds = time.perf_counter() - started
            return stats, {}
        t_old = time.perf_counter()
        self._tokens_computed = self._padding_tokens = 0
        self._group_lp.clear()
        self.model.eval()
        micro, n_empty, n_empty_no_grad = self._my_share(
            micro_batches(rows, self.config.micro_batch_size)
        )
        # Old logprobs (and the weights that depend on them) are known before the update
        # only where needed: over several iterations, or on the reference path. At one
        # optimizer step per batch they equal the update pass's own, detached.
        old: list[torch.Tensor] | None = None
        weights: list[torch.Tensor | None] = []
        n_left_out = tokens_left_out = 0
        sums: dict[bool, list] = {False: [0.0, 0], True: [0.0, 0]}
        if self.config.num_iterations > 1 or not self.token_logprobs.packed:
            old = self._no_grad_logprobs(micro, n_empty_no_grad)
            for mb, old_lp in zip(micro, old, strict=True):
                w, n, tokens = self._micro_weights(mb, old_lp, stats, sums)
                weights.append(w)
                n_left_out += n
                tokens_left_out += tokens
            n_left_out, tokens_left_out = self._left_out_across_ranks(
                n_left_out, tokens_left_out, stats, sums
            )
            self._weight_means(sums, stats)
            if n_left_out == len(rows):
                stats.seconds = time.perf_counter() - started
                return stats, {}
        t_update = time.perf_counter()
        stats.timings["old_logprobs"] = t_update - t_old
        checkpointing = bool(getattr(self.model, "is_gradient_checkpointing", False))
        longest = max(len(r.ids) - r.start for r in rows)
        grads: dict[str, torch.Tensor] = {}
        n_passes = len(micro) + n_empty
        for _ in range(self.config.num_iterations):
            lr = self.config.learning_rate * lr_factor(self.policy_version, self.config)
            for param_group in self.optimizer.param_groups:
                param_group["lr"] = lr
            stats.learning_rate = lr
            self.optimizer.zero_grad(set_to_none=True)
            if checkpointing:
                _train_mode_without_dropout(self.model)
            # Each micro-batch's loss is a sum (unit normalizers); the gradient is divided
            # by the step's normalizer once every micro-batch is in, since which peer
            # completions the plausibility rule leaves out is known only then.
            loss_sum, clip_tokens, kl_tokens, entropy_tokens = 0.0, 0.0, 0.0, 0.0
            for i, mb in enumerate(micro):
                with self._sync(i == n_passes - 1):
                    out, n, tokens = self._micro_loss(mb, old, weights, i, stats, sums)
                    out.loss.backward()
                n_left_out += n
                tokens_left_out += tokens
                loss_sum += float(out.loss.detach())
                clip_tokens += out.clip_frac * out.n_tokens
                kl_tokens += out.kl * out.n_tokens
                entropy_tokens += out.entropy * out.n_tokens
            for k in range(n_empty):
                with self._sync(len(micro) + k == n_passes - 1):
                    self._empty_pass(grad=True)
            self.model.eval()
            loss_sum, clip_tokens, kl_tokens, entropy_tokens = self._sum_across_ranks(
                [loss_sum, clip_tokens, kl_tokens, entropy_tokens]
            )
            if old is None:
                n_left_out, tokens_left_out = self._left_out_across_ranks(
                    n_left_out, tokens_left_out, stats, sums
                )
                self._weight_means(sums, stats)
                if n_left_out == len(rows):
                    self.optimizer.zero_grad(set_to_none=True)
                    stats.seconds = time.perf_counter() - started
                    return stats, {}
            normalizer = loss_normalizer(
                self.config.loss_type,
                num_sequences=len(rows) - n_left_out,
                num_tokens=sum(len(r.ids) - r.start for r in rows) - tokens_left_out,
                # Dr. GRPO's constant: the sampling budget, else this step's longest
                # completion (one constant for every micro-batch of the step).
                max_completion_length=self.max_completion_length or longest,
            )
            # The engines average over ranks what the micro-batches summed.
            scale = (self.parallel.world if self.parallel is not None else 1) / normalizer
            for param in self.model.parameters():
                if param.grad is not None:
                    param.grad.mul_(scale)
            loss_total = loss_sum / normalizer
            if not apply:
                grads = (
                    self.parallel.full_gradients()
                    if self.parallel is not None
                    else {
                        name: p.grad.detach().clone()
                        for name, p in self.model.named_parameters()
                        if p.grad is not None
                    }
                )
                self.optimizer.zero_grad(set_to_none=True)
                break
            grad_norm = clip_grad_norm(list(self.model.parameters()), self.config.max_grad_norm)
            self.optimizer.step()
            self.policy_version += 1
            stats.grad_norm = grad_norm
        self.optimizer.zero_grad(set_to_none=True)
        self._counters_across_ranks(len(groups))
        n_tokens = sum(len(r.ids) - r.start for r in rows) - tokens_left_out
        stats.loss = loss_total
        stats.n_sequences = len(rows) - n_left_out
        stats.n_tokens = n_tokens
        stats.clip_frac = clip_tokens / max(n_tokens, 1)
        stats.kl = kl_tokens / max(n_tokens, 1)
        stats.entropy = entropy_tokens / max(n_tokens, 1)
        stats.policy_version = self.policy_version
        stats.group_logprob = [
            self._group_lp[i][0] / self._group_lp[i][1] if self._group_lp[i][1] else None
            for i in range(len(groups))
        ]
        stats.tokens_computed = self._tokens_computed
        stats.padding_share = self._padding_tokens / max(self._tokens_computed, 1)
        stats.timings["update"] = time.perf_counter() - t_update
        stats.seconds = time.perf_counter() - started
        return stats, grads

    def _micro_loss(
        self,
        mb: list[_Row],
        old: list[torch.Tensor] | None,
        weights: list[torch.Tensor | None],
        i: int,
        stats: StepStats,
        sums: dict[bool, list],
    ) -> tuple[Any, int, int]:
        """One micro-batch's loss (a sum: unit normalizers) and, where its old logprobs
        are its own, the rows and tokens the plausibility rule left out."""
        entropy_on = self.config.entropy_coef > 0
        if self.parallel is None:
            lp, mask, entropy = self._logprobs(self.model, mb, entropy=entropy_on)
        else:
            lp, mask, entropy = self.parallel.compute(
                lambda m: self._logprobs(m, mb, entropy=entropy_on)
            )
        n = tokens = 0
        if old is not None:
            old_lp, w = old[i], weights[i]
        else:
            old_lp = lp.detach()
            w, n, tokens = self._micro_weights(mb, old_lp, stats, sums)
        ref_lp = self.reference.logprobs(lambda m: self._logprobs(m, mb)[0])
        out = self.loss_fn(
            lp,
            old_lp,
            torch.tensor([r.advantage for r in mb], device=self.device),
            mask,
            epsilon=self.config.epsilon,
            epsilon_high=self.config.epsilon_high,
            ref_logprobs=ref_lp,
            beta=self.config.beta,
            importance_weights=w,
            entropy=entropy,
            entropy_coef=self.config.entropy_coef,
            delta=self.config.delta,
            use_bias_correction_kl=self.config.use_bias_correction_kl,
            num_sequences=1,
            num_tokens=1,
            max_completion_length=1,
        )
        return out, n, tokens

    def _left_out_across_ranks(
        self, n_left_out: int, tokens_left_out: int, stats: StepStats, sums: dict[bool, list]
    ) -> tuple[int, int]:
        if self.parallel is None:
            return n_left_out, tokens_left_out
        return left_out_across_ranks(self.parallel, n_left_out, tokens_left_out, stats, sums)

    def _counters_across_ranks(self, n_groups: int) -> None:
        if self.parallel is not None:
            self._tokens_computed, self._padding_tokens = computed_across_ranks(
                self.parallel, self._tokens_computed, self._padding_tokens, self._group_lp, n_groups
            )
