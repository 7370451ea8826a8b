"""The pipeline split: decoder layers per pipeline chunk, and megatron-core's ``pipeline_model_parallel_layout``
strings (``Et|(tt|)*30mL``) written and read."""

from __future__ import annotations

import re
from functools import lru_cache

from ..errors import InfeasibleConfig
from .plan import Plan


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


_REPEATS = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))


@lru_cache(maxsize=1024)
def layout_stages(layout: str) -> tuple[str, ...]:
    """The stages of a Megatron pipeline layout string, unrolled: ``"Et|(tt|)*2mL"`` -> ``["Et", "tt", "tt", "mL"]``.

    A pure-Python twin of megatron-core 0.19.2 ``PipelineParallelLayerLayout.parse_str_to_list`` (commas are
    cosmetic, ``(..)*n`` then ``x*n`` unroll, ``|`` splits stages), so planning needs no megatron import;
    tests/test_plans.py compares the two on many strings.

    Raises:
        InfeasibleConfig: a character other than E, t, m, L, |.
    """
    text = layout.replace(",", "")
    for pattern in _REPEATS:
        text = pattern.sub(lambda match: match.group(1) * int(match.group(2)), text)
    stages = text.split("|")
    bad = sorted({c for c in text if c not in "Etm L|".replace(" ", "")})
    if bad:
        raise InfeasibleConfig(f"pipeline layout '{layout}' has unknown layer character(s) {bad}",
                               "use E (embedding), t (decoder), m (MTP), L (loss) and | between stages")
    return tuple(stages)


def stage_decoder_layers(plan: "Plan") -> tuple[int, ...]:
    """Decoder layers in each of the plan's PP·VPP chunks: its layout string's, else the even split of
    :func:`pipeline_stage_layers`.

    Raises:
        InfeasibleConfig: the layout string's stage count is not PP·VPP, or the even split cannot fill the stages.
    """
    if plan.pipeline_model_parallel_layout:
        stages = _decoders_per_stage(plan.pipeline_model_parallel_layout)
        if len(stages) != plan.layout.num_pipeline_stages:
            lay = plan.layout
            raise InfeasibleConfig(
                f"pipeline layout '{plan.pipeline_model_parallel_layout}' has {len(stages)} stages, but PP={lay.pp} x "
                f"VPP={lay.vpp or 1} needs {lay.num_pipeline_stages}",
                "write a layout with PP·VPP stages, or set model.pipeline_model_parallel_layout=null for an even split")
        return stages
    return _even_stages(plan.model_spec.num_layers, plan.layout.num_pipeline_stages, plan.mtp_num_layers)


@lru_cache(maxsize=1024)
def _even_stages(num_layers: int, num_stages: int, mtp_num_layers: int) -> tuple[int, ...]:
    return tuple(pipeline_stage_layers(num_layers, num_stages, mtp_num_layers))


@lru_cache(maxsize=1024)
def layout_layer_counts(layout: str) -> tuple[int, int]:
    """(decoder layers, MTP layers) a pipeline layout string places (:func:`layout_stages`)."""
    stages = layout_stages(layout)
    return sum(s.count("t") for s in stages), sum(s.count("m") for s in stages)


@lru_cache(maxsize=1024)
def _decoders_per_stage(layout: str) -> tuple[int, ...]:
    return tuple(stage.count("t") for stage in layout_stages(layout))


@lru_cache(maxsize=1024)
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
