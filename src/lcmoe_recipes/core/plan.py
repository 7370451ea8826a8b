"""Plan: a parallel layout plus every knob of one training run, each with the reason it was chosen.

A Plan is what the rules produce and what the checks and the emitter read (request -> rules -> Plan -> checks/cost
-> ConfigContainer). It holds no Megatron object: building and checking a Plan imports neither torch nor megatron.

The search that finds the best Plan for a request is :mod:`lcmoe_recipes.planner.search`; importing this module does
not import it. :data:`HBM_MARGIN` is the planning limit every memory check and the request's ``memory_margin`` share.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import itemgetter

from ..catalog import Hardware, ModelSpec, get_hardware, get_model
from ..errors import UnknownName
from .layout import ParallelLayout

# Our precision names -> megatron-bridge 0.6.2 registered mixed-precision recipes
# (megatron/bridge/training/mixed_precision.py). "FP8 blockwise" is Bridge's "subchannel scaling" recipe
# (fp8_recipe="blockwise": 128x128 weight / 1x128 activation scaling, the DeepSeek-V3 FP8 scheme).
PRECISIONS: dict[str, str] = {
    "bf16": "bf16_mixed",
    "fp8_blockwise": "bf16_with_fp8_subchannel_scaling_mixed",
    "fp8_cs": "bf16_with_fp8_current_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
}


def mixed_precision_name(precision: str) -> str:
    """megatron-bridge's mixed-precision recipe name for one of :data:`PRECISIONS`.

    Raises:
        UnknownName: listing the valid precisions.
    """
    try:
        return PRECISIONS[precision]
    except KeyError:
        raise UnknownName(f"unknown precision '{precision}'", f"valid: {', '.join(PRECISIONS)}") from None


@dataclass(frozen=True)
class Reason:
    """Why a knob has its value: a short sentence and where the rule or number comes from."""

    why: str
    source: str


@dataclass(frozen=True)
class Positions:
    """Rotary position embedding (RoPE) of a run, in Megatron's terms.

    Attributes:
        rotary_base: RoPE base (config.json ``rope_theta``; raised by ABF).
        scaling: "none" (plain RoPE) or "yarn".
        factor: YaRN scaling factor s (1.0 without scaling).
        original_max_position_embeddings: YaRN's original context length L (positions covered: s x L).
        beta_fast, beta_slow: YaRN's correction range (arXiv 2309.00071 uses 32 and 1).
        mscale, mscale_all_dim: YaRN attention-temperature terms (megatron-core: scale
            = yarn_get_mscale(s, mscale) / yarn_get_mscale(s, mscale_all_dim); 1.0 and 0.0 give the paper's 0.1 ln s + 1).
    """

    rotary_base: float
    scaling: str = "none"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None

    def describe(self) -> str:
        """e.g. 'YaRN factor 64 over 4,096 positions (base 10000)' or 'RoPE base 1e+06'."""
        if self.scaling == "yarn":
            return (f"YaRN factor {self.factor:g} over {self.original_max_position_embeddings:,} positions "
                    f"(base {self.rotary_base:g}, beta {self.beta_fast:g}/{self.beta_slow:g}, "
                    f"mscale {self.mscale:g}/{self.mscale_all_dim:g})")
        return f"RoPE base {self.rotary_base:g}, no scaling"


@dataclass(frozen=True)
class Schedule:
    """Optimizer schedule of one training phase (megatron-bridge ``optimizer`` / ``scheduler`` / ``train`` fields).

    Attributes:
        train_iters: optimizer steps of the phase.
        lr, min_lr: peak and final learning rate.
        lr_warmup_iters: linear warm-up steps.
        lr_decay_style: "constant" or "cosine" (megatron-core's names).
    """

    train_iters: int
    lr: float
    min_lr: float
    lr_warmup_iters: int
    lr_decay_style: str = "constant"


@dataclass(frozen=True)
class Plan:
    """Everything needed to emit one ConfigContainer. Field names follow Megatron's where one exists.

    Attributes:
        name: named-recipe name, or "custom".
        model, hardware: catalogue keys.
        seq_length: tokens per sample (set on both model and dataset).
        layout: TP/PP/VPP/CP/EP/ETP over ``layout.world`` GPUs.
        pipeline_model_parallel_layout: Megatron layout string (``E`` embedding, ``t`` decoder, ``m`` MTP,
            ``L`` loss, ``|`` stage break), or None for Megatron's even split.
        micro_batch_size, global_batch_size: MBS and GBS in samples.
        precision: key of :data:`PRECISIONS`.
        moe_token_dispatcher_type, moe_flex_dispatcher_backend: Megatron's dispatcher fields.
        recompute_granularity, recompute_modules, recompute_method, recompute_num_layers: Megatron's recompute
            fields (selective: modules only; full: method + num_layers).
        optimizer_cpu_offload, optimizer_offload_fraction: optimizer state on the CPU (fraction 0..1).
        use_distributed_optimizer, use_precision_aware_optimizer: optimizer fields offload depends on.
        cuda_graph_impl, cuda_graph_modules: Megatron 0.19.2's CUDA-graph fields.
        sequence_parallel: SP (on whenever TP > 1).
        mtp_num_layers: multi-token-prediction layers.
        variable_length: batches whose shapes change step to step (packed / THD sequences not padded to a fixed
            size, ``variable_seq_lengths``); CUDA graphs cannot capture them.
        etp_unset: read from a config whose ``expert_tensor_parallel_size`` is None (megatron-core alone would use TP).
        grad_dtype: main-gradient buffer dtype, "fp32" (``grad_reduce_in_fp32``) or "bf16".
        moment_dtype: Adam moment dtype the run keeps ("fp32", or "bf16" with the precision-aware optimizer on the
            GPU; "fp32" under optimizer CPU offload, see :attr:`effective_moment_dtype`).
        moe_router_bias_update_rate: the update rate of the router's expert biases (auxiliary-loss-free balancing)
            for models that have them; None for models without (nothing written).
        moe_ep_overlap: ``overlap_moe_expert_parallel_comm`` (EP all-to-all hidden behind compute).
        tp_comm_overlap: ``tp_comm_overlap`` as the run has it: Transformer Engine's userbuffers overlap each TP
            all-gather / reduce-scatter with the GEMM beside it. megatron-bridge 0.6.2 ``CommOverlapConfig`` turns it
            off below TP 2, without sequence parallelism and without TE, so True only with TP >= 2 and SP.
        moe_flex_dispatcher_num_sms: SMs the flex dispatcher's kernels (DeepEP, HybridEP) hold while they run
            (megatron-core 0.19.2 ``moe_flex_dispatcher_num_sms``, which the deprecated ``moe_hybridep_num_sms`` /
            ``moe_deepep_num_sms`` route into); None: megatron-core's default, 20. Every megatron-bridge release's
            performance settings give HybridEP 32.
        use_transformer_engine_op_fuser: megatron-core's field: the routed experts run through Transformer Engine's
            op fuser (one fused grouped MLP, biases and clamped GLU inside it) instead of grouped GEMMs with the
            activation and the FC2 bias between them. Off by default (megatron-core 0.19.2); megatron-bridge
            v0.6.0's gpt-oss MXFP8 perf recipes turn it on for GB200 / GB300.
        base_recipe: the megatron-bridge recipe this run starts from ("module:function"; None: its generic
            pre-training template), see :mod:`lcmoe_recipes.catalog.upstream`.
        positions: RoPE setup (None: as the base model was trained, left as megatron-bridge builds it).
        cp_comm_type: how softmax attention exchanges K/V over CP (megatron-core's field): "p2p" (ring, the
            default), "a2a" (heads <-> sequence all-to-all), "all_gather", or hierarchical "a2a+p2p" (with
            ``hierarchical_context_parallel_sizes`` = (a2a size, p2p size)); gated-DeltaNet layers always use their
            own all-to-all.
        hierarchical_cp_sizes: the (a2a, p2p) split of CP for "a2a+p2p".
        schedule: optimizer schedule (None: the base recipe's).
        pretrained_checkpoint: Megatron checkpoint whose model weights the run starts from (optimizer fresh).
        create_attention_mask: ``dataset.create_attention_mask``: megatron-core's GPT dataset builds a dense
            seq_length x seq_length causal mask per sample on the host. False, as megatron-bridge 0.6.2's GPT-OSS
            perf recipe sets it (``perf_recipes/gpt_oss/common.py``): the attention kernel builds the causal mask and
            megatron-bridge's ``gpt_step`` skips the dataset's (``skip_getting_attention_mask_from_dataset``);
            megatron-core's default, which ``recipes/common.py`` ``_pretrain_common`` keeps, is True.
        num_workers: ``dataset.num_workers``, worker processes per data loader (megatron-bridge 0.6.2 default 2).
        eval_iters: ``validation.eval_iters``; above 0, megatron-bridge builds validation and test data loaders beside
            the training one (32 in megatron-bridge 0.6.2's pre-training template).
        eval_global_batch_size: ``validation.eval_global_batch_size`` in samples; None: the training GBS
            (megatron-bridge's default).
        fs_gbps: aggregate write bandwidth of the filesystem the checkpoints go to, GB/s (1e9 bytes/s), which sets
            the save cadence (:func:`lcmoe_recipes.cost.wallclock.save_intervals`); None: its stated default.
        mtbf_hours: the job's mean time between failures, hours, which sets the recovery saves' interval
            (Young/Daly); None: Llama 3's published per-GPU rate over the job's GPUs
            (:func:`lcmoe_recipes.cost.wallclock.job_mtbf_hours`).
        pin_cpu_grads: ``optimizer.pin_cpu_grads``: CPU-offloaded optimizer's gradient copies in pinned memory
            (megatron-core 0.19.2 default True).
        reasons: knob name -> :class:`Reason`.
    """

    name: str
    model: str
    hardware: str
    seq_length: int
    layout: ParallelLayout
    pipeline_model_parallel_layout: str | None
    micro_batch_size: int
    global_batch_size: int
    precision: str
    moe_token_dispatcher_type: str
    moe_flex_dispatcher_backend: str | None
    recompute_granularity: str | None = None
    recompute_modules: tuple[str, ...] = ()
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: float = 0.0
    use_distributed_optimizer: bool = True
    use_precision_aware_optimizer: bool = False
    cuda_graph_impl: str = "none"
    cuda_graph_modules: tuple[str, ...] = ()
    sequence_parallel: bool = False
    mtp_num_layers: int = 0
    variable_length: bool = False
    etp_unset: bool = False
    grad_dtype: str = "fp32"
    moment_dtype: str = "fp32"
    moe_router_bias_update_rate: float | None = None
    moe_ep_overlap: bool = False
    tp_comm_overlap: bool = False
    use_transformer_engine_op_fuser: bool = False
    moe_flex_dispatcher_num_sms: int | None = None
    base_recipe: str | None = field(default=None, compare=False)  # provenance: a config does not record it
    positions: Positions | None = None
    cp_comm_type: str = "p2p"
    hierarchical_cp_sizes: tuple[int, ...] | None = None
    schedule: Schedule | None = None
    pretrained_checkpoint: str | None = None
    create_attention_mask: bool = False
    num_workers: int = 2
    eval_iters: int = 32
    eval_global_batch_size: int | None = None
    fs_gbps: float | None = None
    mtbf_hours: float | None = None
    pin_cpu_grads: bool = True
    reasons: dict[str, Reason] = field(default_factory=dict, compare=False)

    def __hash__(self) -> int:
        """The hash dataclasses would give (every compared field), computed once: the search keys its memos on
        plans, and a plan's 40-odd fields (a layout, tuples, a schedule) cost more to hash than most lookups save."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(_compared(self.__dict__))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __eq__(self, other: object) -> bool:
        """What dataclasses would compare (every compared field), read straight from the two plans' fields: the
        search's memos compare plans on every hit."""
        if self is other:
            return True
        if other.__class__ is not Plan:
            return NotImplemented
        return _compared(self.__dict__) == _compared(other.__dict__)

    def __getstate__(self) -> dict:
        """Pickle and copy without the caches (:data:`_CACHES`): string hashes differ from process to process."""
        return {k: v for k, v in self.__dict__.items() if k not in _CACHES}

    @property
    def model_spec(self) -> ModelSpec:
        return get_model(self.model)

    @property
    def hardware_spec(self) -> Hardware:
        return get_hardware(self.hardware)

    @property
    def num_microbatches(self) -> int:
        """GBS / (MBS·DP): microbatches each DP rank runs per step (gradient-accumulation steps)."""
        return self.global_batch_size // (self.micro_batch_size * self.layout.dp)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_length

    @property
    def effective_moment_dtype(self) -> str:
        """The Adam moment dtype the run keeps: "fp32" under optimizer CPU offload, whatever ``moment_dtype`` says
        (megatron-core 0.19.2 ``optimizer/__init__.py`` ``_get_megatron_optimizer_based_on_param_groups`` builds
        ``HybridDeviceOptimizer`` without ``exp_avg_dtype``), else ``moment_dtype``."""
        return "fp32" if self.optimizer_cpu_offload else self.moment_dtype

    def with_changes(self, **changes) -> "Plan":
        """A copy with fields replaced (a Plan is immutable).

        Raises:
            TypeError: a name that is not a Plan field.
        """
        unknown = changes.keys() - _FIELDS
        if unknown:
            raise TypeError(f"Plan has no field {', '.join(sorted(unknown))}")
        # Plan.__init__ only assigns its fields, so copying them gives what dataclasses.replace gives, at a sixth of
        # the cost: the search builds thousands of variants per request.
        copy = object.__new__(Plan)
        copy.__dict__.update(self.__dict__, **changes)
        for cache in _CACHES:  # the hash and memory terms of the fields before the change
            copy.__dict__.pop(cache, None)
        return copy


_FIELDS = frozenset(f.name for f in fields(Plan))
# What a plan caches beside its fields, worked out from them once: its hash (Plan.__hash__) and the memory terms every
# PP rank shares (lcmoe_recipes.cost.memory._plan_memory).
_CACHES = ("_hash", "_memory")
_compared = itemgetter(*(f.name for f in fields(Plan) if f.compare))  # a plan's __dict__ -> its compared values


# The reason of a config read back from a YAML that does not record the recipe it started from (no lcmoe_recipes
# header): its base is unknown, not megatron-bridge's template.
BASE_NOT_RECORDED = Reason("not recorded: the YAML has no lcmoe_recipes header naming the megatron-bridge recipe it "
                           "started from", "your config")


# Which Plan fields each reason decides: a reason is replaced once one of them changes (overrides, --precision).
REASON_FIELDS: dict[str, tuple[str, ...]] = {
    "layout": ("layout",),
    "pipeline_model_parallel_layout": ("pipeline_model_parallel_layout",),
    "precision": ("precision",),
    "dispatcher": ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend"),
    "recompute": ("recompute_granularity", "recompute_modules", "recompute_method", "recompute_num_layers"),
    "optimizer_cpu_offload": ("optimizer_cpu_offload", "optimizer_offload_fraction", "use_distributed_optimizer",
                              "use_precision_aware_optimizer"),
    "cuda_graphs": ("cuda_graph_impl", "cuda_graph_modules"),
    "global_batch_size": ("global_batch_size", "micro_batch_size"),
    "sequence_parallel": ("sequence_parallel",),
    "positions": ("positions",),
    "cp_comm_type": ("cp_comm_type", "hierarchical_cp_sizes"),
    "schedule": ("schedule",),
    "pretrained_checkpoint": ("pretrained_checkpoint",),
}
# ... and what else it was worked out from: a reason whose own fields are unchanged but whose inputs changed is kept,
# with a note that it was computed for the recipe's values.
REASON_INPUTS: dict[str, tuple[str, ...]] = {
    "pipeline_model_parallel_layout": ("layout",),
    "global_batch_size": ("seq_length", "layout"),
    "sequence_parallel": ("layout",),
    "positions": ("seq_length",),
    "cp_comm_type": ("layout",),
}


def carry_reasons(before: Plan, after: Plan) -> dict[str, Reason]:
    """``before``'s reasons for ``after``: replaced where the overrides changed the knob itself, kept with a note where
    they changed only what the reason was worked out from, kept as they are otherwise."""
    changed = Reason("changed from the recipe by your overrides: the recipe's reason no longer applies", "your override")
    out = {}
    for knob, reason in before.reasons.items():
        same = lambda fields: all(getattr(before, f) == getattr(after, f) for f in fields)  # noqa: E731
        if not same(REASON_FIELDS.get(knob, ())):
            out[knob] = changed
        elif not same(REASON_INPUTS.get(knob, ())):
            inputs = [f for f in REASON_INPUTS[knob] if getattr(before, f) != getattr(after, f)]
            out[knob] = Reason(f"{reason.why} (worked out for the recipe's {' and '.join(inputs)}, which your "
                               "overrides changed; the value itself is the recipe's)", reason.source)
        else:
            out[knob] = reason
    return out


# Plan the whole HBM budget -- the caching allocator's peak plus what lives outside it (the flex dispatcher's buffers,
# the CUDA context, NCCL's communicator buffers: MemoryBreakdown.outside, each priced) -- to at most 95% of HBM: the
# remaining 5% is the fragmentation margin (the allocator's reserved-but-unallocated memory; cost/memory.py module doc,
# docs/accuracy.md "The HBM budget").
HBM_MARGIN = 0.95
