"""Reading ConfigContainer fields back into our terms (layout string, precision key, gradient-reduction dtype): shared
by the emitter, the settings it writes and the upstream-recipe summaries."""

from __future__ import annotations

from typing import Any

from ..core.plan import PRECISIONS

_LAYOUT_CHARS = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}


def layout_to_str(value: Any) -> str | None:
    """A pipeline layout (str, list of lists, or megatron-core's PipelineParallelLayerLayout) as a layout string."""
    if value is None or isinstance(value, str):
        return value
    rows = getattr(value, "input_data", value)
    if isinstance(rows, str):
        return rows
    return "|".join("".join(_LAYOUT_CHARS.get(str(getattr(x, "value", x)), str(x)) for x in row) for row in rows)


def precision_of(mixed_precision: Any) -> str:
    """Our precision key for a ConfigContainer's ``mixed_precision`` (name or MixedPrecisionConfig)."""
    if isinstance(mixed_precision, str):
        name = mixed_precision.replace("-", "_")
        for key, value in PRECISIONS.items():
            if value == name:
                return key
        return name
    if mixed_precision is None:
        return "bf16"
    recipe = getattr(mixed_precision, "fp8_recipe", None) if getattr(mixed_precision, "fp8", None) else None
    return {"blockwise": "fp8_blockwise", "mxfp8": "mxfp8", "tensorwise": "fp8_cs", None: "bf16"}.get(recipe, str(recipe))


def grad_reduce_in_fp32(cfg) -> bool:
    """Whether gradients are reduced in fp32 at run time: a mixed-precision config overwrites the DDP field of the
    same name (megatron-bridge 0.6.2 ``MixedPrecisionConfig.setup``)."""
    mixed = cfg.mixed_precision
    if isinstance(mixed, str):
        from megatron.bridge.training.mixed_precision import get_mixed_precision_config

        mixed = get_mixed_precision_config(mixed)
    value = getattr(mixed, "grad_reduce_in_fp32", None)
    return bool(cfg.ddp.grad_reduce_in_fp32 if value is None else value)


def dispatcher_num_sms(m) -> int | None:
    """The SMs the flex dispatcher runs with under model config ``m``: ``moe_flex_dispatcher_num_sms``, else the
    deprecated ``moe_hybridep_num_sms`` / ``moe_deepep_num_sms`` that megatron-core 0.19.2
    ``TransformerConfig.__post_init__`` routes into it (it refuses two different ones); None: its default (20)."""
    explicit = getattr(m, "moe_flex_dispatcher_num_sms", None)
    if explicit is not None:
        return int(explicit)
    deprecated = [v for v in (getattr(m, "moe_hybridep_num_sms", None), getattr(m, "moe_deepep_num_sms", None))
                  if v is not None]
    return int(deprecated[0]) if deprecated else None
