"""Feasibility checks on a Plan: Megatron's rules that upstream ``validate()`` leaves to run time, plus ours.

Every check returns :class:`Finding` objects (severity, rule, message naming the bad values, fix). They read a
Plan only, import neither torch nor megatron, and run in well under a millisecond per plan.

Sources of the rules (megatron-core 0.19.2 unless said otherwise):
* rank folding -- ``parallel_state.initialize_model_parallel``: world % (TP·PP·CP) and world % (ETP·EP·PP);
  VPP needs PP > 1.
* divisibility -- ``TransformerConfig.__post_init__``: heads % TP, query groups a multiple or divisor of TP,
  gated-DeltaNet linear key/value heads % (TP·CP); ``num_moe_experts % EP`` (``MoELayer``);
  megatron-bridge ``validate()``: seq_length % (2·CP); with SP the per-rank sequence seq_length/CP must split over TP.
* batch -- ``num_microbatches_calculator``: GBS % (MBS·DP); interleaved schedule (``schedules.py``):
  microbatches >= PP and, with the default group size PP, microbatches % PP == 0.
* dispatcher -- megatron-bridge ``flex_dispatcher_backend.py`` (DeepEP: SM 8/9 or B200/B300; HybridEP: SM 8/9/10),
  HybridEP keeps its EP group inside one NVLink domain (Bridge's GB200 recipes set
  ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN`` = EP); DeepEP also has inter-node kernels, so EP may span nodes.
* placement -- the actual groups (:mod:`lcmoe_recipes.core.ranks`, megatron-core's order) against nodes and NVLink blocks.
* precision -- MXFP8 is a Blackwell (SM 10.x) format, FP8 needs SM >= 8.9 (NVIDIA Transformer Engine docs,
  "FP8 support"); Hopper's FP8 recipes are per-tensor and blockwise.
* recompute, CUDA graphs, offload -- ``TransformerConfig.__post_init__`` / ``OptimizerConfig`` (megatron-core 0.19.2
  transformer/transformer_config.py, optimizer/optimizer_config.py); "no attention recompute at very long context" is
  the Megatron-Bridge skill nemo-mbridge-perf-moe-long-context's rule 4.
"""

from __future__ import annotations

import dataclasses
import math
import re
from functools import lru_cache

from ..errors import Finding, InfeasibleConfig, raise_for_errors  # noqa: F401 (re-exported by checks)
from ..core.plan import PRECISIONS, Plan
from ..core.pipeline import layout_layer_counts, layout_stages
from ..core.ranks import max_span
from ..rules.cp import cp_first_guess
from ..rules.precision import fp8_token_alignment

RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts", "gdn_norm_out")
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
LONG_CONTEXT_NO_ATTN_RECOMPUTE = 65536  # tokens; the skill's "avoid SDPA-heavy recompute at very long context"


def _multiples(unit: int, world: int) -> str:
    """'64 or 128': the multiples of ``unit`` on either side of ``world`` (GPU counts a layout folds into)."""
    lower = world // unit * unit
    return f"{lower} or {lower + unit}" if lower else str(unit)


def _near(candidates: list[int], bad: int, n: int = 2) -> str:
    """'32 or 64': the ``n`` candidates closest to ``bad`` (ties: smaller first)."""
    best = sorted(sorted(set(candidates)), key=lambda c: (abs(c - bad), c))[:n]
    return " or ".join(str(c) for c in sorted(best)) if best else "none"


_RECHECKING = [False]  # True while a fix is being re-checked: a fix's own fixes are not re-checked again


def _fitting(plan: Plan, candidates: list[int], bad: int, make, n: int = 2) -> str:
    """Like :func:`_near`, but each candidate value is re-checked first: ``make(value)`` is the plan with the fix
    applied, and a value whose plan the layout rules still refuse is not offered. Of the values that pass, the nearest
    ones whose plan also fits in HBM by the memory model (:func:`_fits_hbm`) are named -- a fresh user was told "CP=2
    or 4" for Qwen3-235B at 128K, both over HBM, while CP=8 fits; where none fits, the nearest passing values are named
    with that said. When none passes, the nearest candidate is named with what else it needs (its first error's
    fix)."""
    if _RECHECKING[0]:
        return _near(candidates, bad, n)
    ranked = sorted(sorted(set(candidates)), key=lambda c: (abs(c - bad), c))
    passing, fitting, first = [], [], None
    _RECHECKING[0] = True
    try:
        for value in ranked:
            try:
                errors = [f for f in check_plan(make(value)) if f.severity == "error"]
            except InfeasibleConfig as exc:
                errors = [Finding("error", "layout", exc.message, exc.fix)]
            if not errors:
                passing.append(value)
                if _fits_hbm(make(value)):
                    fitting.append(value)
                    if len(fitting) == n:
                        break
            elif first is None:
                first = (value, errors[0])
    finally:
        _RECHECKING[0] = False
    if fitting:
        return " or ".join(str(c) for c in sorted(fitting))
    if passing:
        named = sorted(passing[:n])
        return " or ".join(str(c) for c in named) + (
            f" (by the memory model {'neither' if len(named) > 1 else 'it'} then fits in HBM, nor does any other value "
            "the layout rules allow: see the memory finding's fixes)")
    if first is None:
        return "none"
    value, error = first
    _RECHECKING[0] = True
    try:  # the other rule's own fix applied too: named where the two together pass and fit
        pairs = {f"{v} with {knob}={alt}": _verdict(make(v).with_changes(
            layout=dataclasses.replace(make(v).layout, **{knob.lower(): alt})))
            for v in ranked[:4] for knob, alt in _follow_up(make(v))}
    finally:
        _RECHECKING[0] = False
    if fits := [pair for pair, verdict in pairs.items() if verdict == "fits"]:
        return fits[0]
    return f"{value}, which then also needs: {error.fix} ({error.message})" + (
        "; by the memory model no such pair then fits in HBM (its memory finding names what would)"
        if pairs and set(pairs.values()) == {"hbm"} else "")


_LAYOUT_FIX = re.compile(r"^use (TP|CP|EP|PP)=(\d+)(?: or (\d+))?")


def _follow_up(plan: Plan) -> list[tuple[str, int]]:
    """The layout values (knob, value) the first error of ``plan`` names in its fix (``use EP=8 or 16``), nearest
    first; [] where it names none."""
    errors = [f for f in check_plan(plan) if f.severity == "error"]
    match = _LAYOUT_FIX.match(errors[0].fix) if errors else None
    if match is None:
        return []
    knob, now = match.group(1), getattr(plan.layout, match.group(1).lower())
    return sorted(((knob, int(v)) for v in match.groups()[1:] if v), key=lambda kv: abs(kv[1] - now))


def _verdict(plan: Plan) -> str:
    """``fits`` (no error, and within HBM by the memory model), ``hbm`` (no error, over HBM) or ``rules`` (an error)."""
    try:
        if any(f.severity == "error" for f in check_plan(plan)):
            return "rules"
    except InfeasibleConfig:
        return "rules"
    return "fits" if _fits_hbm(plan) else "hbm"


def _fits_hbm(plan: Plan) -> bool:
    """Whether ``plan``'s predicted HBM use is within the planning limit (the memory check's own test,
    :func:`lcmoe_recipes.checks.memory.memory_findings`)."""
    from ..core.plan import HBM_MARGIN
    from ..cost.memory import estimate_memory

    try:
        return estimate_memory(plan).hbm_total <= HBM_MARGIN * plan.hardware_spec.hbm_bytes
    except InfeasibleConfig:
        return False


def _layout_fix(plan: Plan, stages: int) -> str:
    """The fix that sets the pipeline layout launch would derive for ``stages`` = PP·VPP chunks
    (:func:`lcmoe_recipes.core.pipeline.build_pipeline_layout`), quoted for Hydra and the shell. It names the string
    itself: ``=null`` re-derives a layout only where a plan is built (launch, plan), while ``check`` on a YAML reads
    the file as it is."""
    from ..core.pipeline import build_pipeline_layout

    try:
        text = build_pipeline_layout(plan.model_spec.num_layers, stages, plan.mtp_num_layers)
    except InfeasibleConfig as exc:
        return f"lower PP·VPP ({exc.message})"
    return (f"set \"model.pipeline_model_parallel_layout='{text}'\" (the even split over PP·VPP = {stages} chunks "
            "that launch derives)")


def _nearest_power_of_two(n: int) -> int:
    low = 1 << (n.bit_length() - 1)
    return low * 2 if 2 * low - n < n - low else low


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# Gated DeltaNet (Qwen3-Next) arrived in megatron-core 0.16.0 with CP rejected ("Gated delta net does not support
# context parallel for now"); 0.16.x and 0.17.x keep that assert, 0.18.0 adds GDN context parallelism (all-to-all,
# Megatron-LM PR #2642). Read from the released wheels' transformer_config.py, 2026-11-30.
GDN_CP_SINCE = (0, 18, 0)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def megatron_core_version() -> str:
    """The installed megatron-core version (package metadata only: no import), else the pinned 0.19.2."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-core")
    except PackageNotFoundError:
        return "0.19.2"


def check_plan(plan: Plan, megatron_core: str | None = None) -> list[Finding]:
    """Every finding for ``plan`` (errors first). Never raises for a bad plan; see :func:`raise_for_errors`.

    Args:
        megatron_core: the megatron-core version the config will run with (default: the installed one).
    """
    findings: list[Finding] = []
    add = lambda sev, rule, msg, fix: findings.append(Finding(sev, rule, msg, fix))  # noqa: E731
    lay, model, hw = plan.layout, plan.model_spec, plan.hardware_spec
    world, tp, pp, cp, ep, etp, vpp = lay.world, lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.vpp

    # --- placement: whole nodes ---------------------------------------------------------------------
    if (near := hw.whole_node_counts(world)) is not None:
        add("error", "placement/partial-node", f"{world} GPUs do not fill whole {hw.key} nodes of {hw.gpus_per_node} "
            "(nor divide one): Slurm and torchrun start the same number of ranks on every node",
            f"use {near[0]} or {near[1]} GPUs")

    # --- rank folding -------------------------------------------------------------------------------
    folds = math.lcm(tp * pp * cp, etp * ep * pp)  # the GPU counts this layout folds into are its multiples
    if world % (tp * pp * cp):
        ok = [c for c in _divisors(world // (tp * pp)) if plan.seq_length % (2 * c) == 0] if world % (tp * pp) == 0 else []
        ok_tp = [t for t in _divisors(world) if world % (t * pp * cp) == 0 and model.num_attention_heads % t == 0]
        add("error", "rank-folding/dense", f"TP={tp} · PP={pp} · CP={cp} = {tp * pp * cp} does not divide the world size {world}",
            f"use CP={_fitting(plan, ok, cp, lambda c: plan.with_changes(layout=dataclasses.replace(lay, cp=c)))}"
            if ok else (f"use TP={_near(ok_tp, tp)}" if ok_tp else
                                                  f"make TP·PP·CP divide {world}, or use {_multiples(folds, world)} GPUs"))
    if world % (etp * ep * pp):
        ok = [e for e in _divisors(world // (etp * pp)) if model.num_moe_experts % e == 0] if world % (etp * pp) == 0 else []
        ok_pp = [p for p in _divisors(world) if world % (etp * ep * p) == 0 and world % (tp * p * cp) == 0]
        add("error", "rank-folding/expert", f"ETP={etp} · EP={ep} · PP={pp} = {etp * ep * pp} does not divide the world size {world}",
            f"use EP={_near(ok, ep)}" if ok else (f"use PP={_near(ok_pp, pp)}" if ok_pp else
                                                  f"use {_multiples(folds, world)} GPUs (TP·PP·CP and ETP·EP·PP "
                                                  "divide them)"))
    if vpp is not None and vpp > 1 and pp == 1:
        add("error", "pipeline/vpp-needs-pp", f"VPP={vpp} with PP=1",
            "interleaving needs PP > 1: set model.virtual_pipeline_model_parallel_size=null, or PP >= 2")

    # --- divisibility -------------------------------------------------------------------------------
    if model.num_moe_experts % ep:
        add("error", "divisibility/experts-ep", f"{model.num_moe_experts} experts do not split over EP={ep}",
            f"use EP={_near([e for e in _divisors(model.num_moe_experts) if world % (e * etp * pp) == 0] or [1], ep)}")
    if model.num_attention_heads % tp:
        add("error", "divisibility/heads-tp", f"{model.num_attention_heads} attention heads do not split over TP={tp}",
            f"use TP={_near([t for t in _divisors(model.num_attention_heads) if t <= 8 or t <= hw.nvlink_domain], tp)}")
    groups = model.num_query_groups
    if not (groups % tp == 0 or tp % groups == 0):
        add("error", "divisibility/query-groups-tp", f"{groups} query groups are neither a multiple nor a divisor of TP={tp}",
            f"use TP={_near([t for t in (1, 2, 4, 8, 16) if groups % t == 0 or t % groups == 0], tp)}")
    if model.gated_delta_net:
        k_heads, v_heads = model.linear_num_heads
        if k_heads % (tp * cp) or v_heads % (tp * cp):
            ok = [c for c in _divisors(k_heads) if k_heads % (tp * c) == 0 and v_heads % (tp * c) == 0]
            add("error", "divisibility/linear-heads-tp-cp",
                f"gated DeltaNet linear heads (key {k_heads}, value {v_heads}) do not split over TP·CP = {tp}·{cp} = {tp * cp}",
                f"use CP={_near(ok, cp)} at TP={tp}" if ok else "lower TP")
    # --- features: a dense model has no experts; the CP exchange of softmax attention -------------------------
    if not model.is_moe and ep > 1:
        add("error", "parallel/ep-dense-model", f"EP={ep} on {model.display}, which has no experts",
            "use EP=1 (megatron-core: expert_model_parallel_size > 1 needs num_moe_experts)")
    if cp > 1 and any(k != "gdn" for k in model.layer_attention):
        findings.extend(_cp_exchange_findings(plan.model, tp, cp, plan.cp_comm_type))
    if cp > 1 and plan.seq_length % (2 * cp):
        ok = [c for c in (2**i for i in range(1, 12)) if plan.seq_length % (2 * c) == 0]
        folds = [c for c in ok if world % (tp * pp * c) == 0]
        ok = folds or ok  # prefer CPs that also fold into the world size, so the two fixes agree
        add("error", "divisibility/seq-cp",
            f"CP={cp} does not divide seq_length {plan.seq_length} into 2·CP chunks (load-balanced causal split)",
            f"use CP={_fitting(plan, ok, cp, lambda c: plan.with_changes(layout=dataclasses.replace(lay, cp=c)))}")
    align = fp8_token_alignment(plan.precision)
    guess, _ = cp_first_guess(plan.seq_length)
    splits = [c for c in (2**i for i in range(0, 12)) if (c == 1 or plan.seq_length % (2 * c) == 0)
              and (not align or (plan.micro_batch_size * plan.seq_length // c) % align == 0)]
    if splits and max(splits) < guess:  # (none at all: the FP8 token rule below refuses it)
        power = _nearest_power_of_two(plan.seq_length)
        add("warning", "divisibility/seq-length-cp",
            f"seq_length {plan.seq_length:,} splits into 2·CP load-balanced chunks" + (
                f" of a multiple of {align} tokens ({plan.precision})" if align else "")
            + f" only for CP <= {max(splits)}, below the CP rule's first guess CP={guess} (seq_length/4096): the "
            "layout must hold the attention of long sequences with less CP",
            f"use seq_length {power:,} (a power of two: every CP up to {min(64, power // 2048)} splits it), e.g. "
            f"--seq {power}")
    tokens = plan.micro_batch_size * plan.seq_length // cp
    if align and not plan.variable_length and (tokens % align or (plan.micro_batch_size * plan.seq_length) % cp):
        unit = align * 2 * cp
        low = plan.seq_length - plan.seq_length % unit
        power = _nearest_power_of_two(plan.seq_length)
        near = " or ".join(f"{v:,}" for v in (low, low + unit) if v)
        add("error", "divisibility/fp8-tokens",
            f"{plan.precision} needs the tokens per GEMM input (MBS·seq_length/CP = {plan.micro_batch_size}·"
            f"{plan.seq_length}/{cp}) to be a multiple of {align}",
            f"use seq_length {near} (multiples of {align}·2·CP = {unit}) at CP={cp}, or a power of two such as "
            f"{power:,}, which every CP splits")
    if plan.sequence_parallel and tp > 1 and plan.seq_length % cp == 0 and (plan.seq_length // cp) % tp:
        # (a seq_length CP does not divide is refused by divisibility/seq-cp, whose fix names the CPs that do)
        ok_tp = [t for t in _divisors(tp) if (plan.seq_length // cp) % t == 0 and model.num_attention_heads % t == 0]
        add("error", "divisibility/seq-tp-sp",
            f"with sequence parallel, seq_length/CP = {plan.seq_length}/{cp} does not split over TP={tp}",
            f"use a seq_length divisible by CP·TP = {cp * tp}" + (f", or TP={max(ok_tp)}" if ok_tp else ""))
    if model.gated_delta_net and cp > 1:
        mcore = megatron_core or megatron_core_version()
        if _version_tuple(mcore) < GDN_CP_SINCE:
            add("error", "gdn/cp-support", f"{model.display}'s gated DeltaNet with CP={cp} on megatron-core {mcore}, "
                "which rejects context parallelism for gated DeltaNet (0.16.x-0.17.x)",
                "use megatron-core >= 0.18.0 (0.19.2 is pinned here), or CP=1")
    if plan.etp_unset and ep > 1:
        add("warning", "parallel/etp-unset", f"expert_tensor_parallel_size is unset with EP={ep}: megatron-core alone "
            f"would use ETP=TP={tp}; megatron-bridge quietly sets 1", "set model.expert_tensor_parallel_size "
            "explicitly (1 for EP-only experts)")
    if tp > 1 and not plan.sequence_parallel:
        # megatron-core 0.19.2 transformer/moe/moe_layer.py, MoELayer.forward: a ValueError at the first training step.
        add("error" if model.num_moe_experts else "warning", "parallel/sp-off",
            f"TP={tp} without sequence parallel: megatron-core's MoELayer.forward refuses to train MoE layers with "
            "TP > 1 and sequence parallel off", "set model.sequence_parallel=true")

    # --- batch --------------------------------------------------------------------------------------
    mbs, gbs = plan.micro_batch_size, plan.global_batch_size
    try:
        dp = lay.dp
    except InfeasibleConfig:
        dp = None
    if not all(isinstance(n, int) and n >= 1 for n in (mbs, gbs)):
        # megatron-core 0.19.2 num_microbatches_calculator.py (GBS required, >= 1 microbatch); megatron-bridge 0.6.2
        # data/samplers.py, MegatronPretrainingSampler.__init__ (micro_batch_size > 0).
        add("error", "batch/positive", f"MBS={mbs}, GBS={gbs}: both must be positive integers",
            "set train.micro_batch_size >= 1 and train.global_batch_size to a multiple of MBS·DP")
    elif dp is not None:
        interleaved = bool(vpp and vpp > 1)
        step = mbs * dp * (pp if interleaved else 1)
        lower = max(gbs // step * step, mbs * dp * (pp if interleaved else 1))
        fix = f"use GBS={' or '.join(str(g) for g in sorted({lower, lower + step} - {gbs}) if g > 0)}"
        if gbs % (mbs * dp):
            add("error", "batch/gbs-mbs-dp", f"GBS={gbs} is not divisible by MBS·DP = {mbs}·{dp} = {mbs * dp}", fix)
        elif interleaved:
            micro = gbs // (mbs * dp)
            if micro < pp or micro % pp:
                add("error", "batch/microbatches-vpp",
                    f"interleaved pipeline (PP={pp}, VPP={vpp}) needs microbatches per step (GBS/(MBS·DP) = {micro}) "
                    f"to be a multiple of PP and at least PP", fix)

    # --- pipeline split without an explicit layout ----------------------------------------------------
    if plan.pipeline_model_parallel_layout is None and pp > 1:
        if model.num_layers % pp or (vpp and (model.num_layers // pp) % vpp):
            add("error", "pipeline/even-split",
                f"{model.num_layers} layers do not split evenly over PP={pp}" + (f"·VPP={vpp}" if vpp else "")
                + f" ({model.num_layers / pp:g} per PP rank"
                + (f", {model.num_layers / (pp * vpp):.3g} per virtual stage" if vpp else "") + ")",
                _layout_fix(plan, lay.num_pipeline_stages))
    if plan.pipeline_model_parallel_layout is not None:
        text = plan.pipeline_model_parallel_layout
        try:
            stages = layout_stages(text)
        except InfeasibleConfig as exc:
            add("error", "pipeline/layout", exc.message, exc.fix)
            stages = None
        layers_ok = True
        if stages is not None:
            decoders, mtps = layout_layer_counts(text)
            layers_ok = decoders == model.num_layers and mtps == plan.mtp_num_layers
            if not layers_ok:
                add("error", "pipeline/layout-layers",
                    f"pipeline_model_parallel_layout '{text}' places {decoders} decoder and {mtps} MTP layers; the model "
                    f"has {model.num_layers} and {plan.mtp_num_layers}", "give a layout with every layer once: "
                    + _layout_fix(plan, lay.num_pipeline_stages))
        if stages is not None and len(stages) != lay.num_pipeline_stages:
            # PPs that keep the string: PP·VPP = its stage count, VPP > 1 only with PP > 1, and the ranks still fold
            fits = [p for p in range(1, len(stages) + 1) if len(stages) % p == 0 and (p > 1 or len(stages) == 1)
                    and world % (tp * p * cp) == 0 and world % (etp * ep * p) == 0]
            keep = (f"keep PP·VPP = {len(stages)} (PP in {fits}, VPP = {len(stages)}/PP), or "
                    if fits and layers_ok else "")
            add("error", "pipeline/layout-stages",
                f"pipeline_model_parallel_layout '{text}' has {len(stages)} stages but PP={pp} x VPP={vpp or 1} = "
                f"{lay.num_pipeline_stages}", keep + _layout_fix(plan, lay.num_pipeline_stages))

    # --- positions (RoPE / YaRN) --------------------------------------------------------------------
    findings.extend(position_findings(plan))

    # --- dispatcher ---------------------------------------------------------------------------------
    backend = plan.moe_flex_dispatcher_backend
    if plan.moe_token_dispatcher_type == "flex":
        if backend == "deepep" and not hw.supports_deepep:
            add("error", "dispatcher/deepep-hardware", f"DeepEP does not run on {hw.display} ({hw.device_name})",
                "use moe_flex_dispatcher_backend=hybridep (NVL72) or moe_token_dispatcher_type=alltoall")
        if backend == "hybridep" and not hw.supports_hybridep:
            add("error", "dispatcher/hybridep-hardware", f"HybridEP does not run on {hw.display}", "use alltoall")
        if backend not in ("deepep", "hybridep", "ncclep"):
            add("error", "dispatcher/flex-backend", f"flex dispatcher with backend {backend!r}",
                "set moe_flex_dispatcher_backend to deepep (H100/H200/B200) or hybridep (GB200/GB300)")
    # --- placement: which groups leave NVLink (megatron-core's rank order, core/ranks.py) -----------------------
    if not any(f.rule.startswith("rank-folding") for f in findings):
        if backend == "hybridep" and plan.moe_token_dispatcher_type == "flex":
            spans = max_span(lay, "expert", "tp-ep", hw.job_block)
            if spans > 1:
                add("warning", "placement/hybridep-ep-domain",
                    f"HybridEP group of ETP·EP = {etp * ep} ranks spans {spans} NVLink blocks of {hw.job_block} GPUs "
                    f"on {hw.key}: its dispatch leaves NVLink", f"use ETP·EP <= {hw.job_block}")
        if tp > 1 and max_span(lay, "dense", "tp", hw.job_block) > 1:
            add("warning", "placement/tp-off-nvlink", f"TP={tp} groups span more than one NVLink domain "
                f"({hw.job_block} GPUs): TP's per-layer all-gathers would cross the scale-out network",
                f"use TP <= {hw.job_block}")

    findings.extend(knob_findings(plan))
    if plan.precision not in PRECISIONS:
        add("error", "precision/name", f"unknown precision {plan.precision!r}", f"valid: {', '.join(PRECISIONS)}")
    elif plan.precision == "mxfp8" and hw.compute_capability[0] < 10:
        add("error", "precision/hardware", f"MXFP8 needs Blackwell tensor cores (SM 10.x); {hw.display} is SM "
            f"{hw.compute_capability[0]}.{hw.compute_capability[1]}", "use fp8_blockwise or fp8_cs on Hopper, or bf16")
    elif plan.precision.startswith("fp8") and hw.compute_capability < (8, 9):
        add("error", "precision/hardware", f"FP8 needs SM 8.9 or newer; {hw.display} is older", "use bf16")
    elif plan.precision == "fp8_blockwise" and hw.compute_capability[0] >= 10:  # e.g. an H100 config retargeted
        add("warning", "precision/blockwise-on-blackwell",
            f"FP8 blockwise scaling on {hw.display}: Transformer Engine runs it there, but Blackwell's native block "
            "scaling is MXFP8 (1x32 blocks), what the planner picks on Blackwell for a model trained in block-scaled "
            "FP8, and no published row measures blockwise FP8 on Blackwell, so its predicted step borrows MXFP8's",
            "use mxfp8 (launch --precision mxfp8, or mixed_precision=bf16_with_mxfp8_mixed), or keep it and measure")

    findings.sort(key=lambda f: f.severity != "error")
    return findings


def knob_findings(plan: Plan) -> list[Finding]:
    """The findings of :func:`check_plan` on ``plan``'s recompute, optimizer CPU offload and CUDA-graph fields, in
    its order (unsorted). Every other check reads none of those fields, so a plan that differs from a checked one
    only there (the search's rungs) needs only these."""
    findings: list[Finding] = []
    add = lambda sev, rule, msg, fix: findings.append(Finding(sev, rule, msg, fix))  # noqa: E731
    model = plan.model_spec
    # --- recompute ----------------------------------------------------------------------------------
    modules = plan.recompute_modules
    if plan.recompute_granularity == "selective":
        unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
        if unknown:
            add("error", "recompute/module-name", f"unknown recompute module(s) {unknown}",
                f"valid modules: {', '.join(RECOMPUTE_MODULES)} (seed shorthand: up_proj -> mla_up_proj, norm -> layernorm)")
        if "mla_up_proj" in modules and not model.multi_latent_attention:
            add("error", "recompute/mla-up-proj", f"mla_up_proj recompute on {model.display}, which has no MLA",
                "drop mla_up_proj (it exists for MLA models such as DeepSeek-V3 only)")
        if "gdn_norm_out" in modules and not model.gated_delta_net:
            add("error", "recompute/gdn-norm-out", f"gdn_norm_out recompute on {model.display} (no gated DeltaNet)", "drop gdn_norm_out")
        if "mlp" in modules and model.num_dense_layers == 0:
            add("warning", "recompute/mlp-noop", f"mlp recompute on {model.display}: every layer is MoE, so it recomputes nothing",
                "drop mlp, or use moe / moe_act for MoE layers")
        if "moe_act" in modules and plan.use_transformer_engine_op_fuser:
            add("warning", "recompute/moe-act-op-fuser", "moe_act recompute with use_transformer_engine_op_fuser: "
                "megatron-core 0.19.2 runs the routed experts through the op fuser's fused grouped MLP, and only its "
                "unfused path recomputes the activation (transformer/moe/experts.py), so the activation stays saved",
                "drop moe_act (recompute moe for the whole MoE layer), or set "
                "model.use_transformer_engine_op_fuser=false")
        if "core_attn" in modules and plan.seq_length >= LONG_CONTEXT_NO_ATTN_RECOMPUTE:
            add("warning", "recompute/core-attn-long-context",
                f"core_attn recompute at seq_length {plan.seq_length}: re-runs the quadratic attention for little memory",
                "recompute " + " / ".join(m for m in ("layernorm", "moe_act", "mla_up_proj", "moe")
                                          if (m != "mla_up_proj" or model.multi_latent_attention)
                                          and (m not in ("moe_act", "moe") or model.is_moe)) + " instead")
        if plan.recompute_num_layers is not None:
            add("error", "recompute/selective-num-layers", "selective recompute with recompute_num_layers set", "unset recompute_num_layers")
    elif plan.recompute_granularity == "full":
        if plan.recompute_method not in ("uniform", "block") or not plan.recompute_num_layers:
            add("error", "recompute/full-args", "full recompute needs recompute_method (uniform|block) and recompute_num_layers",
                "set both, e.g. recompute_method=uniform recompute_num_layers=1")
        if plan.cuda_graph_impl not in ("none", "full_iteration"):
            add("error", "recompute/full-with-graphs", f"full recompute with cuda_graph_impl={plan.cuda_graph_impl}",
                "use selective recompute, or cuda_graph_impl=none")
    elif plan.recompute_granularity is not None:
        add("error", "recompute/granularity", f"recompute_granularity={plan.recompute_granularity!r}", "use None, 'selective' or 'full'")

    # --- optimizer CPU offload -------------------------------------------------------------------------
    if plan.optimizer_cpu_offload:
        if not plan.use_distributed_optimizer:
            add("error", "offload/distributed-optimizer", "optimizer CPU offload without the distributed optimizer",
                "set use_distributed_optimizer=True")
        if not plan.use_precision_aware_optimizer:
            add("error", "offload/precision-aware", "optimizer CPU offload without the precision-aware optimizer",
                "set optimizer.use_precision_aware_optimizer=True")
        if not 0.0 < plan.optimizer_offload_fraction <= 1.0:
            add("error", "offload/fraction", f"optimizer_offload_fraction={plan.optimizer_offload_fraction} with offload on",
                "use a fraction in (0, 1]")

    # --- CUDA graphs ---------------------------------------------------------------------------------
    graphs = plan.cuda_graph_modules
    if plan.cuda_graph_impl != "none":
        unknown = [g for g in graphs if g not in CUDA_GRAPH_MODULES]
        if unknown:
            add("error", "cuda-graphs/module-name", f"unknown CUDA-graph module(s) {unknown}", f"valid: {', '.join(CUDA_GRAPH_MODULES)}")
        if "moe" in graphs and "moe_router" in graphs:
            add("error", "cuda-graphs/moe-router", "CUDA-graph modules moe and moe_router together", "keep one of them")
        if plan.variable_length:
            add("error", "cuda-graphs/dynamic-shapes", f"CUDA graphs ({plan.cuda_graph_impl}) with variable-length "
                "batches (packed / THD sequences not padded to a fixed size, or variable_seq_lengths)",
                "set model.cuda_graph_impl=none; or, for megatron-bridge's SFT datasets with offline packing, pad to a "
                "static shape (dataset.pad_to_max_length=true and dataset.offline_packing_specs.pad_cu_seqlens=true)")
        if "moe_preprocess" in graphs and "moe_router" not in graphs:
            add("error", "cuda-graphs/preprocess-needs-router", "moe_preprocess graphed without moe_router", "add moe_router")
        if plan.recompute_granularity == "selective" and "moe" in modules and "moe_router" in graphs:
            add("error", "cuda-graphs/moe-recompute", "moe recompute with the moe_router module graphed (TE graphs)",
                "recompute moe_act instead of moe, or drop moe_router from cuda_graph_modules")
    return findings


# Errors after which the layout is not a legal Megatron layout: memory and step figures would describe nothing real.
STRUCTURAL = ("rank-folding", "divisibility/", "pipeline/", "batch/", "config/")


def layout_is_legal(findings: list[Finding]) -> bool:
    """True when no finding is a structural error (:data:`STRUCTURAL`): the memory and step models apply."""
    return not any(f.severity == "error" and f.rule.startswith(STRUCTURAL) for f in findings)


@lru_cache(maxsize=1024)
def _cp_exchange_findings(model_key: str, tp: int, cp: int, kind: str) -> tuple[Finding, ...]:
    """Transformer Engine's context-parallel attention rules (context_parallel.py, attn_forward_func_with_cp and
    AttnFuncWithCPAndQKVOA2A): sliding windows only over a2a / all_gather, learnable softmax (sinks) only over a2a,
    and a2a splits this TP rank's query and K/V heads over CP. One (model, TP, CP, ``cp_comm_type``) at a time: the
    same for every layout sharing them."""
    from ..catalog import get_model
    from ..rules.cp import a2a_heads_fit

    model = get_model(model_key)
    if kind not in ("p2p", "a2a", "all_gather", "a2a+p2p"):
        return (Finding("error", "cp/comm-type", f"cp_comm_type={kind!r}", "use p2p, a2a, all_gather or a2a+p2p"),)
    out = []
    if model.sliding_window and kind not in ("a2a", "all_gather"):
        out.append(Finding("error", "cp/sliding-window-exchange", f"{model.display}'s sliding-window layers with "
                           f"CP={cp} over cp_comm_type={kind}: Transformer Engine runs sliding windows only over a2a "
                           "or all_gather", "set model.cp_comm_type=a2a (or all_gather)"))
    if model.attention_sinks and kind != "a2a":
        out.append(Finding("error", "cp/attention-sinks-exchange", f"{model.display}'s learnable softmax offsets "
                           f"(attention sinks) with CP={cp} over cp_comm_type={kind}: Transformer Engine supports them "
                           "only over a2a", "set model.cp_comm_type=a2a"))
    if kind == "a2a" and not a2a_heads_fit(model, tp, cp):
        ok = [c for c in (1, 2, 4, 8, 16, 32, 64) if a2a_heads_fit(model, tp, c)]
        out.append(Finding("error", "divisibility/heads-cp-a2a", f"cp_comm_type=a2a splits heads over CP: "
                           f"{model.num_attention_heads} query and {model.num_query_groups} K/V heads over TP={tp} do "
                           f"not divide by CP={cp}", f"use CP in {ok} at TP={tp}, or lower TP"))
    return tuple(out)


_YARN_FIELDS = (("factor", "rotary_scaling_factor"), ("original_max_position_embeddings", "original_max_position_embeddings"),
                ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow"), ("mscale", "mscale"),
                ("mscale_all_dim", "mscale_all_dim"))


def position_findings(plan: Plan) -> list[Finding]:
    """RoPE covers seq_length, and a YaRN setting is complete (megatron-core's YaRN code computes its correction
    range from every one of its fields: a None among them is a TypeError when the model is built)."""
    if plan.positions is None:
        return []
    return list(_position_findings(plan.model, plan.seq_length, plan.positions))


@lru_cache(maxsize=1024)
def _position_findings(model_key: str, seq_length: int, p) -> tuple[Finding, ...]:
    """:func:`position_findings` of one (model, seq_length, positions): the same for every layout the search builds."""
    from ..catalog import get_model
    from ..rules.positions import choose_positions, coverage

    spec = get_model(model_key)
    prefix = "model." if spec.multi_latent_attention else "model.yarn_"
    if p.scaling == "yarn":
        missing = [name for attr, name in _YARN_FIELDS if getattr(p, attr) is None]
        if missing:
            full, _ = choose_positions(spec, seq_length, "yarn")
            values = {name: getattr(full, attr) for attr, name in _YARN_FIELDS}
            return (Finding("error", "positions/yarn-incomplete",
                            f"YaRN is on but {', '.join(prefix + m for m in missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} unset: megatron-core fails building the model",
                            "set all of them, e.g. " + " ".join(f"{prefix}{k}={v:g}" for k, v in values.items())
                            + " (or launch --rope yarn, which writes a complete setting)"),)
    covered = coverage(spec, p)
    if seq_length <= covered:
        return ()
    yarn, _ = choose_positions(spec, seq_length, "yarn")
    return (Finding("error", "positions/not-covered",
                    f"seq_length {seq_length:,} exceeds the positions RoPE covers ({p.describe()}: {covered:,})",
                    f"YaRN factor {yarn.factor:g} over {yarn.original_max_position_embeddings:,} covers it: launch "
                    f"--rope yarn (or auto), or set {prefix}rotary_scaling_factor={yarn.factor:g} with the other YaRN "
                    "fields"),)
