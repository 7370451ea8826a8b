"""The decisions every plan takes for its layout, named recipe or planned: base recipe, positions, token budget and
GBS, schedule, pipeline layout string, and where the weights come from (each from its rule, with its reason)."""

from __future__ import annotations

from functools import lru_cache

from ..catalog import Hardware, ModelSpec
from ..catalog.upstream import base_recipe
from ..core.layout import ParallelLayout
from ..core.pipeline import build_pipeline_layout
from ..core.plan import Reason
from ..core.request import TrainingRequest
from ..cost.overlap import COMM_OVERLAP_SOURCE, tp_overlap_allowed
from ..cost.shapes import shapes
from .base import GRAD_DTYPE_REASON, base_layout, choose_base
from .batch import EVAL_ITERS, choose_batch, choose_eval_batch, tokens_per_step
from .positions import choose_positions
from .schedule import choose_schedule


@lru_cache(maxsize=256)
def _run_decisions(model_key: str, hw_key: str, seq_length: int, precision: str, world: int, rope: str,
                   tokens: int | None, lr: float | None, train_iters: int | None):
    """The decisions of :func:`extension_fields` that do not depend on the layout's split (base recipe, positions,
    token budget, schedule): the same for every layout of one request, so taken once per request."""
    from ..catalog import get_hardware, get_model

    spec, hw = get_model(model_key), get_hardware(hw_key)
    base, why_base = choose_base(spec, hw, precision, world)
    record, _ = base_recipe(spec, hw, precision, world)
    return (base, why_base, record, choose_positions(spec, seq_length, rope),
            tokens_per_step(spec, shapes(spec).total_params, tokens),
            choose_schedule(spec, record.min_lr if record else None, lr, train_iters))


def extension_fields(spec: ModelSpec, hw: Hardware, seq_length: int, layout: ParallelLayout, precision: str,
                     options: TrainingRequest) -> tuple[dict, dict[str, Reason]]:
    """(Plan fields, reasons) for running ``spec`` at ``seq_length`` with ``layout``, with the run options of
    ``options`` (:data:`lcmoe_recipes.core.request.RUN_OPTIONS`: rope, tokens_per_step, global_batch_size,
    micro_batch_size, lr, train_iters, pretrained_checkpoint).

    Raises:
        LcmoeError: a bad option (rope choice, non-positive tokens / LR / steps).
        InfeasibleConfig: the layout has more pipeline stages than the model can fill.
    """
    base, why_base, record, (positions, why_positions), (tokens, why_tokens), (schedule, why_schedule) = _run_decisions(
        spec.key, hw.key, seq_length, precision, layout.world, options.rope, options.tokens_per_step, options.lr,
        options.train_iters)
    gbs, why_gbs = choose_batch(seq_length, layout, options.micro_batch_size, tokens, options.global_batch_size)
    eval_gbs, why_eval = choose_eval_batch(seq_length, layout, options.micro_batch_size, EVAL_ITERS, gbs)
    upstream = base_layout(spec, hw, precision, layout.world, layout.pp, layout.vpp)
    if upstream is not None:
        pipeline = upstream
        why_pipeline = Reason(f"upstream's layout for PP{layout.pp}·VPP{layout.vpp or 1}: {upstream}",
                              f"megatron-bridge recipe {record.name}")
    else:
        pipeline = build_pipeline_layout(spec.num_layers, layout.num_pipeline_stages, spec.mtp_num_layers)
        why_pipeline = Reason(
            f"{spec.num_layers} decoder layers spread evenly over PP·VPP = {layout.num_pipeline_stages} chunks, the "
            "embedding, each MTP layer and the loss counting as one layer each (so the first and last chunks stay "
            "light)" if pipeline else "PP=1: no pipeline", "lcmoe_recipes.core.pipeline.pipeline_stage_layers")
    weights = options.pretrained_checkpoint
    bias_rate, why_bias = choose_bias_update_rate(spec)
    tp_on, why_tp = _tp_comm_overlap(base.get("tp_comm_overlap", False), layout.tp, record)
    fields = {**base, "tp_comm_overlap": tp_on, "moe_router_bias_update_rate": bias_rate, "positions": positions, "global_batch_size": gbs, "micro_batch_size": options.micro_batch_size,
              "schedule": schedule, "pipeline_model_parallel_layout": pipeline, "pretrained_checkpoint": weights,
              "eval_iters": EVAL_ITERS, "eval_global_batch_size": eval_gbs}
    reasons = {
        "base_recipe": why_base, "grad_dtype": GRAD_DTYPE_REASON, "positions": why_positions, "schedule": why_schedule,
        "pipeline_model_parallel_layout": why_pipeline, "eval_global_batch_size": why_eval,
        **({"tp_comm_overlap": why_tp} if why_tp else {}),
        **({"moe_router_bias_update_rate": why_bias} if why_bias else {}),
        "global_batch_size": Reason(f"{why_gbs.why}; {why_tokens.why}", f"{why_gbs.source}; {why_tokens.source}"),
        "pretrained_checkpoint": Reason(
            f"model weights from {weights} (optimizer state fresh)" if weights else
            "random initialisation: no --from-hf / --from-checkpoint given, so the extension schedule trains from "
            "scratch", "your request"),
    }
    return fields, reasons


def _tp_comm_overlap(asked: bool, tp: int, record) -> tuple[bool, Reason | None]:
    """(``tp_comm_overlap`` as the run will have it, its reason): the base recipe's, kept only where megatron-bridge
    keeps it (TP >= 2 with sequence parallelism, which every plan with TP >= 2 has:
    :func:`lcmoe_recipes.cost.overlap.tp_overlap_allowed`); no reason where the recipe does not ask for it."""
    if not asked:
        return False, None
    allowed, why = tp_overlap_allowed(tp, tp > 1)
    source = f"megatron-bridge recipe {record.name}; {COMM_OVERLAP_SOURCE}"
    if not allowed:
        return False, Reason(f"the base recipe asks for tp_comm_overlap, but {why}", source)
    return True, Reason("tp_comm_overlap on, as the base recipe asks: Transformer Engine's userbuffers overlap the "
                        f"TP{tp} all-gathers / reduce-scatters with the GEMMs beside them", source)


# The expert-bias update rate of auxiliary-loss-free load balancing during a context extension: 0, the biases frozen.
# DeepSeek-V3 set its bias update speed to 0.001 for the first 14.3T pre-training tokens and to 0.0 for the remaining
# 500B, and the context extension follows that final phase at its final learning rate (technical report arXiv
# 2412.19437 §4.2 "Hyper-Parameters" and §4.3 "Long Context Extension"); megatron-core's default is 1e-3.
EXTENSION_BIAS_UPDATE_RATE = 0.0


def choose_bias_update_rate(spec: ModelSpec) -> tuple[float | None, Reason | None]:
    """(``moe_router_bias_update_rate``, reason) for a context extension of ``spec``; (None, None) for a model whose
    router has no expert biases (``ModelSpec.expert_bias``)."""
    if not spec.expert_bias:
        return None, None
    return EXTENSION_BIAS_UPDATE_RATE, Reason(
        "expert biases frozen during the extension (moe_router_bias_update_rate 0; megatron-core's default 1e-3 keeps "
        "adapting them): the released model's balance was settled at the end of pre-training, which ran its last "
        "500B tokens with a bias update speed of 0, and the extension continues from there at its final learning "
        "rate, where a moving bias would re-route tokens while the model adapts to long positions; routing stays "
        "balanced by the frozen biases and the sequence-wise auxiliary loss",
        "DeepSeek-V3 technical report arXiv 2412.19437 §4.2 (bias update speed 0.001 for the first 14.3T tokens, "
        "0.0 for the remaining 500B) and §4.3 (long-context extension after pre-training); megatron-core 0.19.2 "
        "TransformerConfig.moe_router_bias_update_rate")


EP_OVERLAP_SOURCE = ("megatron-core 0.19.2 transformer/transformer_config.py TransformerConfig.__post_init__ "
                     "(overlap_moe_expert_parallel_comm asserts); megatron-bridge 0.6.2 training/comm_overlap.py "
                     "(delay_wgrad_compute needs it)")


def recompute_or_graphs_block_ep_overlap(granularity: str | None, modules, method: str | None,
                                         num_layers: int | None, graph_impl: str, graph_modules) -> str | None:
    """What of a plan's recompute and CUDA graphs megatron-core 0.19.2 forbids together with
    ``overlap_moe_expert_parallel_comm`` (None: nothing): full recompute (or a recompute method / layer count),
    'moe' in the recompute modules, Transformer Engine CUDA graphs over the moe or mlp scope
    (``transformer/transformer_config.py``, ``TransformerConfig.__post_init__``)."""
    if granularity == "full" or method or num_layers:
        return "full recompute"
    if "moe" in (modules or ()):
        return "'moe' in recompute_modules"
    if graph_impl == "transformer_engine" and {"moe", "mlp"} & set(graph_modules or ()):
        return "Transformer Engine CUDA graphs over the moe / mlp scope"
    return None


def layout_blocks_ep_overlap(ep: int, dispatcher: str | None, pp: int, vpp: int | None, mtp_num_layers: int
                             ) -> list[str]:
    """What of a layout megatron-core 0.19.2 forbids together with ``overlap_moe_expert_parallel_comm`` (empty:
    nothing): EP=1, a dispatcher other than alltoall/flex, PP>1 without VPP, more than one MTP layer
    (``transformer/transformer_config.py``, ``TransformerConfig.__post_init__``)."""
    out = []
    if ep == 1:
        out.append("EP=1")
    if dispatcher not in ("alltoall", "flex"):
        out.append(f"the {dispatcher} dispatcher (alltoall/flex only)")
    if pp > 1 and not vpp:
        out.append("PP>1 without VPP")
    if mtp_num_layers > 1:
        out.append(f"{mtp_num_layers} MTP layers (at most 1)")
    return out


def ep_overlap_blockers(plan) -> list[str]:
    """What in ``plan`` megatron-core 0.19.2 forbids together with ``overlap_moe_expert_parallel_comm`` (empty: it
    may be on): :func:`layout_blocks_ep_overlap`, then :func:`recompute_or_graphs_block_ep_overlap`."""
    lay = plan.layout
    out = layout_blocks_ep_overlap(lay.ep, plan.moe_token_dispatcher_type, lay.pp, lay.vpp, plan.mtp_num_layers)
    knobs = recompute_or_graphs_block_ep_overlap(plan.recompute_granularity, plan.recompute_modules,
                                                 plan.recompute_method, plan.recompute_num_layers,
                                                 plan.cuda_graph_impl, plan.cuda_graph_modules)
    return out + ([knobs] if knobs else [])


def with_ep_overlap(plan, recipe_on: bool | None = None):
    """``plan`` with the EP all-to-all overlap (``overlap_moe_expert_parallel_comm``) it asks for
    (``plan.moe_ep_overlap``), turned off where the plan's recompute, CUDA graphs or layout forbid it; the reason
    says which. ``recipe_on``: whether the base recipe sets it (None: the plan's own setting is the recipe's, as
    for the named recipes and a retargeted config); where it does not, the planner turned it on because megatron-core
    allows it, and the reason says so (the planner adds what it gains: :mod:`lcmoe_recipes.planner.search`). Its price
    is the step model's: each layer's dispatch and combine beside the other microbatch's compute block, exposed =
    max(0, communication - that block) (:mod:`lcmoe_recipes.cost.overlap`)."""
    if not plan.moe_ep_overlap:
        return plan
    recipe_on = plan.moe_ep_overlap if recipe_on is None else recipe_on
    who = "the base recipe overlaps it with compute" if recipe_on else "the planner would overlap it with compute"
    blockers = ep_overlap_blockers(plan)
    if blockers:
        why = (f"EP all-to-all overlap off: {who}, but megatron-core forbids that with {', '.join(blockers)} (this "
               "plan needs them to fit or to run)")
        return plan.with_changes(moe_ep_overlap=False, reasons={**plan.reasons,
                                                                 "moe_ep_overlap": Reason(why, EP_OVERLAP_SOURCE)})
    why = ("EP all-to-all overlapped with compute (overlap_moe_expert_parallel_comm), as the base recipe sets it"
           if recipe_on else
           "EP all-to-all overlapped with compute (overlap_moe_expert_parallel_comm, with delay_wgrad_compute), which "
           "the base recipe leaves off: megatron-core allows it here (EP > 1, alltoall / flex dispatcher, no full or "
           "'moe' recompute, PP = 1 or VPP, at most one MTP layer)")
    return plan.with_changes(reasons={**plan.reasons, "moe_ep_overlap": Reason(why, EP_OVERLAP_SOURCE)})


def with_cp_comm(plan):
    """``plan`` with its context-parallel communication chosen (:func:`lcmoe_recipes.rules.cp.choose_cp_comm`)."""
    return with_priced_cp_comm(plan)[0]


def with_priced_cp_comm(plan):
    """(:func:`with_cp_comm` of ``plan``, its ``StepEstimate`` at the fitted constants and its ``StepTerms`` where
    the choice priced them, else None, None)."""
    from .cp import priced_cp_comm

    kind, sizes, why, step, terms = priced_cp_comm(plan)
    return plan.with_changes(cp_comm_type=kind, hierarchical_cp_sizes=sizes,
                             reasons={**plan.reasons, "cp_comm_type": why}), step, terms
