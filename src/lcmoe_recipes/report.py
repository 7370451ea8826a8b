"""Readable text for a Plan: the layout with DP and EDP, every knob, and why (no megatron import)."""

from __future__ import annotations

from .checks import Finding
from .plan import PRECISIONS, Plan


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.0f} GiB"


def schedule_text(plan: Plan) -> str:
    """'1000 steps x 62.9M tokens = 62.9B tokens; LR 7.3e-06 constant after 20 warm-up steps' (or the base's)."""
    s = plan.schedule
    if s is None:
        return "the base recipe's"
    total = s.train_iters * plan.tokens_per_step
    decay = "constant" if s.lr_decay_style == "constant" else f"{s.lr_decay_style} to {s.min_lr:g}"
    return (f"{s.train_iters} steps x {plan.tokens_per_step / 1e6:.1f}M tokens = {total / 1e9:.1f}B tokens; LR {s.lr:g} "
            f"{decay} after {s.lr_warmup_iters} warm-up steps")


def format_plan(plan: Plan, warnings: list[Finding] = (), overrides: list[str] = ()) -> str:
    """A multi-line summary of ``plan``: target, layout (DP/EDP), batch, every knob with its reason."""
    lay, model, hw = plan.layout, plan.model_spec, plan.hardware_spec
    nodes = lay.world // hw.gpus_per_node
    rows = [
        ("recipe", plan.name),
        ("model", f"{model.display}: {model.num_layers} layers"
                  + (f" + {plan.mtp_num_layers} MTP" if plan.mtp_num_layers else "")
                  + (f", {model.num_moe_experts} experts top-{model.moe_router_topk}" if model.is_moe else ", dense MLP")
                  + f", {model.attention_kind} attention"
                  + (f" (window {model.sliding_window})" if model.sliding_window else "")),
        ("target", f"{lay.world} x {hw.display} ({nodes} nodes x {hw.gpus_per_node}, NVLink domain {hw.nvlink_domain}, "
                   f"{_gib(hw.hbm_bytes)} HBM each)"),
        ("seq_length", f"{plan.seq_length:,} tokens (model and dataset)"),
        ("layout", f"TP={lay.tp} PP={lay.pp} VPP={lay.vpp or 1} CP={lay.cp} EP={lay.ep} ETP={lay.etp} "
                   f"-> DP={lay.dp} EDP={lay.edp}"),
        ("pipeline layout", plan.pipeline_model_parallel_layout or "even split"),
        ("batch", f"MBS={plan.micro_batch_size} GBS={plan.global_batch_size} -> {plan.num_microbatches} "
                  f"microbatch{'' if plan.num_microbatches == 1 else 'es'} per DP rank, "
                  f"{plan.tokens_per_step / 1e6:.1f}M tokens per step"),
        ("precision", f"{plan.precision} (mixed_precision='{PRECISIONS.get(plan.precision, plan.precision)}')"),
        ("dispatcher", plan.moe_token_dispatcher_type
         + (f" + {plan.moe_flex_dispatcher_backend}" if plan.moe_flex_dispatcher_backend else "")),
        ("recompute", f"{plan.recompute_granularity}: {', '.join(plan.recompute_modules)}"
         if plan.recompute_granularity == "selective"
         else (f"full ({plan.recompute_method}, recompute_num_layers={plan.recompute_num_layers})"
               if plan.recompute_granularity else "none")),
        ("optimizer", ("distributed" if plan.use_distributed_optimizer else "replicated")
         + (", precision-aware" if plan.use_precision_aware_optimizer else "")
         + (f", CPU offload fraction {plan.optimizer_offload_fraction:g}" if plan.optimizer_cpu_offload else ", no CPU offload")),
        ("CUDA graphs", f"{plan.cuda_graph_impl}: {', '.join(plan.cuda_graph_modules)}"
         if plan.cuda_graph_impl != "none" else "none"),
        ("sequence parallel", "on" if plan.sequence_parallel else "off"),
        ("positions", plan.positions.describe() if plan.positions else "as the model was trained"),
        ("schedule", schedule_text(plan)),
        ("weights", f"from {plan.pretrained_checkpoint} (model weights; optimizer state fresh)"
         if plan.pretrained_checkpoint else "random initialisation (--from-hf DIR or --from-checkpoint DIR to extend "
                                            "a pretrained model)"),
        ("based on", f"megatron-bridge {plan.base_recipe.rpartition(':')[2]}" if plan.base_recipe
         else "megatron-bridge's pre-training template"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"  {k:<{width}}  {v}" for k, v in rows]
    if overrides:
        lines.append(f"  {'overrides':<{width}}  {' '.join(overrides)}")
    if plan.reasons:
        lines.append("  why:")
        lines += [f"    - {knob}: {r.why} [{r.source}]" for knob, r in plan.reasons.items()]
    if warnings:
        lines.append("  warnings:")
        lines += [f"    - {w.rule}: {w.message}; {w.fix}" for w in warnings]
    return "\n".join(lines)
