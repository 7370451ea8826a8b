"""Recompute: selective before full, modules chosen by the model's attention and MoE type, escalated one step at a
time only as far as the memory model requires; no attention recompute at very long context."""

from __future__ import annotations

from ..catalog import ModelSpec
from ..core.plan import Reason

SOURCE = ("Megatron-Bridge skill nemo-mbridge-perf-moe-long-context rules 3-4 (selective before full; avoid SDPA "
          "recompute at long context); megatron-core 0.19.2 recompute modules (transformer/transformer_config.py "
          "TransformerConfig.recompute_modules; transformer/transformer_layer.py)")


def recompute_ladder(model: ModelSpec) -> list[tuple[str | None, tuple[str, ...]]]:
    """(granularity, modules) from none to full, each step adding the next cheapest module that applies:
    layernorm, and moe_act for MoE models (grouped GEMM), mla_up_proj only for MLA, gdn_norm_out only for gated
    DeltaNet, mlp only when dense layers exist, then the whole MoE layer (MoE models), then full recompute.
    core_attn is never chosen (flash attention keeps no s x s scores: it frees little and re-runs the quadratic
    part)."""
    steps: list[tuple[str, ...]] = [("layernorm", "moe_act") if model.is_moe else ("layernorm",)]
    if model.multi_latent_attention:
        steps.append(steps[-1] + ("mla_up_proj",))
    if model.gated_delta_net:
        steps.append(steps[-1] + ("gdn_norm_out",))
    if model.num_dense_layers:
        steps.append(steps[-1] + ("mlp",))
    if model.is_moe:
        steps.append(tuple(m for m in steps[-1] if m != "moe_act") + ("moe",))
    return [(None, ())] + [("selective", s) for s in steps] + [("full", ())]


def recompute_reason(level: int, ladder_len: int, granularity: str | None, modules: tuple[str, ...]) -> Reason:
    if granularity is None:
        return Reason("no recompute: the layout fits without it", SOURCE)
    if granularity == "full":
        return Reason("full recompute: no selective set fits", SOURCE)
    return Reason(f"selective {', '.join(modules)}: the least recompute that fits (step {level} of "
                  f"{ladder_len - 1} on the ladder)", SOURCE)
