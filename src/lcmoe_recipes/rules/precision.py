"""Precision: an extension keeps the base model's training precision where the GPU has it."""

from __future__ import annotations

from ..catalog import Hardware, ModelSpec
from ..catalog.history import history_of
from ..core.plan import Reason

def fp8_token_alignment(precision: str) -> int | None:
    """The multiple the tokens of one GEMM input (MBS x seq_length / CP) must be under ``precision`` (one of
    :data:`lcmoe_recipes.core.plan.PRECISIONS`): 32 for MXFP8 (both dimensions of every quantized tensor), 8 for the
    other FP8 recipes (the leading dimension); None for BF16. Source: Transformer Engine 2.x
    ``pytorch/utils.py`` ``assert_dim_for_fp8_exec`` / ``assert_dim_for_all_gather`` and megatron-core 0.19.2
    ``fp8_utils.get_fp8_align_size``."""
    if precision == "bf16":
        return None
    return 32 if precision == "mxfp8" else 8


TE_SOURCE = ("NVIDIA Transformer Engine docs, 'Using FP8 with Transformer Engine' (FP8 block scaling: Hopper; MXFP8: "
             "Blackwell)")


def choose_precision(spec: ModelSpec, hw: Hardware, wish: str | None) -> tuple[str, Reason]:
    """(precision key, reason): the request's, else the precision the base model was trained in (published in
    :mod:`lcmoe_recipes.catalog.history`; BF16 when none is published), mapped to the GPU's form of it."""
    if wish:
        return wish, Reason(f"{wish}, as requested", "your request")
    history = history_of(spec.published_id)
    trained = history.precision
    if trained is None:
        return "bf16", Reason(f"BF16: {spec.display} publishes no low-precision training, so an extension keeps BF16 "
                              "(--precision fp8_blockwise|fp8_cs|mxfp8 to change it)", spec.card_source)
    if trained == "fp8_blockwise" and hw.compute_capability[0] >= 10:
        return "mxfp8", Reason(f"MXFP8: {spec.display} was trained in block-scaled FP8; on Blackwell ({hw.display}) "
                               "that is MXFP8 (1x32 blocks)", f"{history.source}; {TE_SOURCE}")
    if trained.startswith("fp8") and hw.compute_capability < (8, 9):
        return "bf16", Reason(f"BF16: {spec.display} was trained in FP8, which {hw.display} lacks", TE_SOURCE)
    return trained, Reason(f"{trained}: the precision {spec.display} was trained in", history.source)
