"""The decisions every plan takes for its layout, named recipe or planned: base recipe, positions, token budget and
GBS, schedule, pipeline layout string, and where the weights come from (each from its rule, with its reason)."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import Hardware, ModelSpec
from ..catalog.upstream import base_recipe
from ..cost.shapes import shapes
from ..layout import ParallelLayout
from ..plan import Reason, build_pipeline_layout
from .base import base_layout, choose_base
from .batch import choose_batch, tokens_per_step
from .positions import choose_positions
from .schedule import choose_schedule


@dataclass(frozen=True)
class RunOptions:
    """What a user may ask of any run (``launch``/``plan`` flags, ``TrainingRequest`` fields, named-recipe options).

    Attributes:
        rope: "auto", "yarn", "abf" or "keep" (:func:`lcmoe_recipes.rules.positions.choose_positions`).
        tokens_per_step: tokens per optimizer step (None: the rule's default).
        global_batch_size: a fixed GBS instead of the token budget.
        micro_batch_size: MBS.
        lr, train_iters: the phase's learning rate and steps (None: extension defaults).
        pretrained_checkpoint: Megatron checkpoint whose weights the run starts from (None: random init).
    """

    rope: str = "auto"
    tokens_per_step: int | None = None
    global_batch_size: int | None = None
    micro_batch_size: int = 1
    lr: float | None = None
    train_iters: int | None = None
    pretrained_checkpoint: str | None = None


def extension_fields(spec: ModelSpec, hw: Hardware, seq_length: int, layout: ParallelLayout, precision: str,
                     options: RunOptions = RunOptions()) -> tuple[dict, dict[str, Reason]]:
    """(Plan fields, reasons) for running ``spec`` at ``seq_length`` with ``layout``.

    Raises:
        LcmoeError: a bad option (rope choice, non-positive tokens / LR / steps).
        InfeasibleConfig: the layout has more pipeline stages than the model can fill.
    """
    base, why_base = choose_base(spec, hw, precision, layout.world)
    record, _ = base_recipe(spec, hw, precision, layout.world)
    positions, why_positions = choose_positions(spec, seq_length, options.rope)
    tokens, why_tokens = tokens_per_step(spec, shapes(spec).total_params, options.tokens_per_step)
    gbs, why_gbs = choose_batch(seq_length, layout, options.micro_batch_size, tokens, options.global_batch_size)
    schedule, why_schedule = choose_schedule(spec, record.min_lr if record else None, options.lr, options.train_iters)
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
            "light)" if pipeline else "PP=1: no pipeline", "lcmoe_recipes.plan.pipeline_stage_layers")
    weights = options.pretrained_checkpoint
    fields = {**base, "positions": positions, "global_batch_size": gbs, "micro_batch_size": options.micro_batch_size,
              "schedule": schedule, "pipeline_model_parallel_layout": pipeline, "pretrained_checkpoint": weights}
    reasons = {
        "base_recipe": why_base, "positions": why_positions, "schedule": why_schedule,
        "pipeline_model_parallel_layout": why_pipeline,
        "global_batch_size": Reason(f"{why_gbs.why}; {why_tokens.why}", f"{why_gbs.source}; {why_tokens.source}"),
        "pretrained_checkpoint": Reason(
            f"model weights from {weights} (optimizer state fresh)" if weights else
            "random initialisation: no --from-hf / --from-checkpoint given, so the extension schedule trains from "
            "scratch", "your request"),
    }
    return fields, reasons


def with_cp_comm(plan):
    """``plan`` with its context-parallel communication chosen (:func:`lcmoe_recipes.rules.cp.choose_cp_comm`)."""
    from .cp import choose_cp_comm

    kind, sizes, why = choose_cp_comm(plan)
    return plan.with_changes(cp_comm_type=kind, hierarchical_cp_sizes=sizes,
                             reasons={**plan.reasons, "cp_comm_type": why})
