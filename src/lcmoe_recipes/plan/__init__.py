"""Plan: a parallel layout plus every knob of one training run, each with the reason it was chosen.

A Plan is what the rules produce and what the checks and the emitter read (request -> rules -> Plan -> checks/cost
-> ConfigContainer). It holds no Megatron object: building and checking a Plan imports neither torch nor megatron.

This package is the Plan (the data type, here) and the ``plan`` command (:mod:`.cli`, run as
``python -m lcmoe_recipes.plan``, with :mod:`.compare` for targets side by side). The search that finds the best
Plan for a request is :mod:`lcmoe_recipes.search`; importing this package does not import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..catalog import Hardware, ModelSpec, get_hardware, get_model
from ..errors import InfeasibleConfig, UnknownName
from ..layout import ParallelLayout

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
        moment_dtype: Adam moment dtype ("fp32", or "bf16" with the precision-aware optimizer).
        moe_ep_overlap: ``overlap_moe_expert_parallel_comm`` (EP all-to-all hidden behind compute).
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
    moe_ep_overlap: bool = False
    reasons: dict[str, Reason] = field(default_factory=dict, compare=False)

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
        return copy


_FIELDS = frozenset(f.name for f in fields(Plan))


# Which Plan fields each reason speaks for: a reason is dropped once one of them changes (overrides, --precision).
REASON_FIELDS: dict[str, tuple[str, ...]] = {
    "layout": ("layout",),
    "pipeline_model_parallel_layout": ("pipeline_model_parallel_layout", "layout"),
    "precision": ("precision",),
    "dispatcher": ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend"),
    "recompute": ("recompute_granularity", "recompute_modules", "recompute_method", "recompute_num_layers"),
    "optimizer_cpu_offload": ("optimizer_cpu_offload", "optimizer_offload_fraction", "use_distributed_optimizer",
                              "use_precision_aware_optimizer"),
    "cuda_graphs": ("cuda_graph_impl", "cuda_graph_modules"),
    "global_batch_size": ("global_batch_size", "micro_batch_size", "seq_length", "layout"),
    "sequence_parallel": ("sequence_parallel", "layout"),
}


def carry_reasons(before: Plan, after: Plan) -> dict[str, Reason]:
    """``before``'s reasons, each kept only while the fields it explains are unchanged in ``after``."""
    changed = Reason("changed from the recipe by your overrides: the recipe's reason no longer applies", "your override")
    return {knob: (reason if all(getattr(before, f) == getattr(after, f) for f in REASON_FIELDS.get(knob, ())) else changed)
            for knob, reason in before.reasons.items()}


def pipeline_stage_layers(num_layers: int, num_stages: int, mtp_num_layers: int = 0) -> list[int]:
    """Decoder layers in each of ``num_stages`` pipeline chunks (stage index = vpp_rank·PP + pp_rank).

    Each decoder layer, the embedding, each MTP layer and the loss count as one slot; slots are spread evenly and
    the spare ones go to middle stages first, so the first stage (embedding) and the last (MTP + loss) stay light.

    Raises:
        InfeasibleConfig: more stages than the model can fill (a middle stage would hold no decoder layer).
    """
    if num_stages == 1:
        return [num_layers]
    fixed_first, fixed_last = 1, mtp_num_layers + 1  # embedding; MTP layers + loss
    base, extra = divmod(num_layers + fixed_first + fixed_last, num_stages)
    decoders = [base] * num_stages
    for index in (list(range(1, num_stages - 1)) + [0, num_stages - 1])[:extra]:
        decoders[index] += 1
    decoders[0] -= fixed_first
    decoders[-1] -= fixed_last
    if min(decoders) < 0 or min(decoders[1:-1] or [1]) < 1:
        raise InfeasibleConfig(
            f"{num_layers} layers (+{mtp_num_layers} MTP) cannot fill {num_stages} pipeline stages (PP·VPP)",
            f"use PP·VPP <= {max(1, (num_layers + fixed_first + fixed_last) // 2)}",
        )
    return decoders


def build_pipeline_layout(num_layers: int, num_stages: int, mtp_num_layers: int = 0) -> str | None:
    """A Megatron pipeline layout string that spreads the model evenly over ``num_stages`` (= PP·VPP) chunks.

    The split is :func:`pipeline_stage_layers`'; runs of identical stages are written with Megatron's ``(..|)*n``
    repeat. Examples: DeepSeek-V3 (61 layers + 1 MTP) over PP8·VPP4 -> ``Et|(tt|)*30mL``; Qwen3-235B (94) over PP4·VPP12 ->
    ``Et|(tt|)*46tL``. The string is parsed and checked by megatron-core's ``PipelineParallelLayerLayout``
    when the ConfigContainer is emitted.

    Returns:
        the layout string, or None when ``num_stages == 1`` (no pipeline).

    Raises:
        InfeasibleConfig: more stages than the model can fill (a stage would hold no decoder layer).
    """
    if num_stages == 1:
        return None
    decoders = pipeline_stage_layers(num_layers, num_stages, mtp_num_layers)

    def stage(i: int) -> str:
        t = "t" * decoders[i] if decoders[i] <= 3 else f"t*{decoders[i]}"
        return ("E" if i == 0 else "") + t + ("m" * mtp_num_layers + "L" if i == num_stages - 1 else "")

    stages = [stage(i) for i in range(num_stages)]
    out, i = [], 0
    while i < num_stages - 1:
        run = 1
        while i + run < num_stages - 1 and stages[i + run] == stages[i]:
            run += 1
        out.append(f"({stages[i]}|)*{run}" if run > 1 else f"{stages[i]}|")
        i += run
    return "".join(out) + stages[-1]

