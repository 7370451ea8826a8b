"""The mesh planner: every legal layout for a TrainingRequest, the rules for each knob, the checks and the cost model;
the fastest layout that fits wins.

Search (no torch / megatron import):

1. layouts: TP in {1, 2, 4, 8} (heads and query groups split, TP inside one node or NVLink block), CP from
   :func:`rules.cp.cp_candidates` (powers of two around seq_length/4096), PP in {1, 2, 4, 8, 16}, VPP the finest
   interleave that keeps two layers per chunk (the bubble is (PP-1)/VPP microbatches), EP a power of two dividing the
   experts with ETP = 1; Megatron's folding rules (world % TP·PP·CP, world % ETP·EP·PP) and any fixed wish;
2. per layout: dispatcher, precision, batch (rules), then the least recompute and the smallest optimizer offload
   that fit in HBM_MARGIN of HBM (rules.recompute ladder, rules.offload fractions), then CUDA graphs (rules);
3. the checks (:func:`lcmoe_recipes.checks.check_plan`) drop what Megatron would reject, and
   :func:`lcmoe_recipes.cost.host_findings` what a node's RAM cannot hold;
4. rank by predicted step time; among layouts within KEEP_DP_SLACK (1%) of the fastest, prefer the largest DP
   (the skill's "keep DP alive").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .catalog import MODELS, get_hardware, get_model
from .checks import check_plan
from .cost import HBM_MARGIN, estimate_memory, estimate_step, host_findings
from .cost.memory import GDN_MEASURED_RATIOS, MemoryBreakdown
from .cost.step import StepEstimate
from .errors import InfeasibleConfig
from .layout import ParallelLayout
from .plan import Plan, Reason
from .request import TrainingRequest
from .rules.cp import a2a_heads_fit, cp_candidates, cp_first_guess
from .rules.cuda_graphs import choose_cuda_graphs
from .rules.dispatcher import choose_dispatcher
from .rules.extension import extension_fields, with_cp_comm
from .rules.offload import FRACTIONS, offload_reason
from .rules.precision import choose_precision
from .rules.recompute import recompute_ladder, recompute_reason

KEEP_DP_SLACK = 0.01   # prefer more DP among layouts within 1% of the fastest (a tie for the model)
VPP_CHOICES = (16, 12, 8, 6, 4, 3, 2)


@dataclass(frozen=True)
class Candidate:
    """One fitting layout with its knobs, predicted memory and step."""

    plan: Plan
    memory: MemoryBreakdown
    step: StepEstimate


@dataclass(frozen=True)
class PlanResult:
    """The planner's answer: the winner, the ranked fitting candidates, and what was rejected and why."""

    request: TrainingRequest
    best: Candidate
    ranked: list[Candidate]
    considered: int
    rejected: dict[str, int] = field(default_factory=dict)
    why: str = ""


def _vpp(num_layers: int, mtp: int, pp: int) -> int | None:
    """The finest interleave whose chunks still hold two slots each (decoder layers + embedding + MTP + loss)."""
    if pp == 1:
        return None
    slots = num_layers + 2 + mtp
    for v in VPP_CHOICES:
        if slots >= 2 * pp * v:
            return v
    return None


def enumerate_layouts(request: TrainingRequest) -> list[ParallelLayout]:
    """Every layout Megatron can fold for the request (before memory and the finer checks)."""
    model, hw = get_model(request.model), get_hardware(request.hardware)
    world, seq = request.num_gpus, request.seq_length
    heads, groups = model.num_attention_heads, model.num_query_groups
    tps = [t for t in (1, 2, 4, 8) if heads % t == 0 and (groups % t == 0 or t % groups == 0)
           and t <= hw.gpus_per_node * (1 if hw.nvlink_domain <= 8 else 2)]
    cps = cp_candidates(seq, world)
    # variable-length batches with PP > 1 deadlock or swap shapes (Megatron-LM #5100, docs/known_issues.md)
    pps = [1] if request.variable_length else [p for p in (1, 2, 4, 8, 16) if 2 * p <= model.num_layers]
    eps = [e for e in (1, 2, 4, 8, 16, 32, 64, 128, 256) if model.num_moe_experts % e == 0] if model.is_moe else [1]
    out = []
    for tp in [request.tp] if request.tp else tps:
        for cp in [request.cp] if request.cp else cps:
            if model.gated_delta_net and any(h % (tp * cp) for h in model.linear_num_heads):
                continue
            if model.attention_sinks and cp > 1 and not a2a_heads_fit(model, tp, cp):
                continue  # sinks need the a2a CP exchange, which splits heads over CP
            for pp in [request.pp] if request.pp else pps:
                if world % (tp * pp * cp):
                    continue
                for ep in [request.ep] if request.ep else eps:
                    if world % (ep * pp) or ep > world // pp:
                        continue
                    out.append(ParallelLayout(world=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=1,
                                              vpp=_vpp(model.num_layers, model.mtp_num_layers, pp)))
    return out


def _plan_for(request: TrainingRequest, layout: ParallelLayout, reject: dict[str, int]) -> Candidate | None:
    model, hw = get_model(request.model), get_hardware(request.hardware)
    (dispatcher, backend), why_dispatch = choose_dispatcher(hw, layout, request.dispatcher, model.is_moe)
    precision, why_precision = choose_precision(model, hw, request.precision)
    try:
        common, why_common = extension_fields(model, hw, request.seq_length, layout, precision, request.run_options())
    except InfeasibleConfig as exc:
        _reject(reject, "pipeline/too-many-stages", exc.fix)
        return None
    guess, why_cp = cp_first_guess(request.seq_length)
    base = Plan(
        name="planned", model=model.key, hardware=hw.key, seq_length=request.seq_length, layout=layout,
        precision=precision, moe_token_dispatcher_type=dispatcher, moe_flex_dispatcher_backend=backend,
        sequence_parallel=layout.tp > 1, mtp_num_layers=model.mtp_num_layers, variable_length=request.variable_length,
        **common)
    errors = [f for f in check_plan(base) if f.severity == "error"]
    if errors:
        _reject(reject, errors[0].rule, errors[0].fix)
        return None
    limit = memory_limit(model, hw)
    ladder = recompute_ladder(model)
    fractions = FRACTIONS if request.allow_cpu_offload else (0.0,)
    worst = _with_knobs(base, ladder[-1], fractions[-1], hw, request)
    if estimate_memory(worst).total > limit:
        _reject(reject, "memory/exceeds-hbm", MEMORY_FIX)
        return None
    for level, fraction in _fitting_knobs(base, ladder, fractions, limit, hw, request):
        granularity, modules = ladder[level]
        plan = _with_knobs(base, ladder[level], fraction, hw, request)
        memory = estimate_memory(plan)
        if memory.total <= limit:
            if any(f.severity == "error" for f in check_plan(plan) + host_findings(plan)):  # + a node's RAM
                continue
            reasons = {
                **why_common,
                "layout": Reason(f"the fastest fitting layout the model predicts (first CP guess {guess})", why_cp.source),
                "cp": Reason(f"CP={layout.cp}" + (f": the first guess, {why_cp.why}" if layout.cp == guess else
                                                  f", not the first guess {guess} ({why_cp.why}): the search kept "
                                                  "the fastest layout that fits"), why_cp.source),
                "sequence_parallel": Reason("on: TP>1 (MoE with TP>1 needs it)" if layout.tp > 1 else "off: TP=1",
                                            "megatron-core TransformerConfig"),
                "dispatcher": why_dispatch, "precision": why_precision,
                "recompute": recompute_reason(level, len(ladder), granularity, modules),
                "optimizer_cpu_offload": offload_reason(fraction),
                "cuda_graphs": choose_cuda_graphs(hw, request.variable_length, granularity, modules, backend,
                                                  model.is_moe)[1],
            }
            plan = with_cp_comm(plan.with_changes(reasons=reasons))
            return Candidate(plan, memory, estimate_step(plan))
    _reject(reject, "memory/exceeds-hbm", MEMORY_FIX)
    return None


MEMORY_FIX = "use more GPUs, a shorter seq_length, or a GPU with more HBM"
# gated DeltaNet (Qwen3-Next): with gated DeltaNet priced from megatron-core's implementation the memory model predicts
# 0.50-0.82 of the published peaks (was 0.46-0.78; docs/accuracy.md N1-N3, layouts and method unpublished); plan such
# models as if the prediction were at its most optimistic measured ratio.
UNCALIBRATED_FACTOR = GDN_MEASURED_RATIOS[1]


def memory_limit(model, hw) -> float:
    """Bytes the planner lets the predicted peak reach: HBM_MARGIN of HBM, times UNCALIBRATED_FACTOR for models
    whose memory the model under-predicts."""
    return HBM_MARGIN * hw.hbm_bytes * (UNCALIBRATED_FACTOR if model.gated_delta_net else 1.0)


def _reject(reject: dict, rule: str, fix: str) -> None:
    count, first_fix = reject.get(rule, (0, fix))
    reject[rule] = (count + 1, first_fix)


def _fitting_knobs(base: Plan, ladder, fractions, limit: float, hw, request):
    """(recompute level, offload fraction) pairs to try, cheapest first: every selective level without offload;
    then, level by level, the smallest offload fraction that fits (the optimizer state on the GPU falls linearly
    with the fraction, so one estimate at fraction 1 gives it); then full recompute the same way."""
    selective = [i for i, (g, _) in enumerate(ladder) if g != "full"]
    full = [i for i, (g, _) in enumerate(ladder) if g == "full"]
    for level in selective:
        yield level, 0.0
    if len(fractions) == 1:
        yield from ((level, 0.0) for level in full)
        return
    for level in selective + full:
        at_one = estimate_memory(_with_knobs(base, ladder[level], 1.0, hw, request))
        if at_one.total > limit:
            continue
        state = at_one.detail["optimizer_shard_params"] * (4 + 2 * (4 if base.moment_dtype == "fp32" else 2))
        need = next((f for f in fractions[1:] if at_one.total + state * (1 - f) <= limit), 1.0)
        yield level, need
        if level in full:
            return
    yield from ((level, 0.0) for level in full)


def _with_knobs(base: Plan, recompute: tuple, fraction: float, hw, request: TrainingRequest) -> Plan:
    granularity, modules = recompute
    (impl, graphs), _ = choose_cuda_graphs(hw, request.variable_length, granularity, modules,
                                           base.moe_flex_dispatcher_backend, base.model_spec.is_moe)
    return base.with_changes(
        recompute_granularity=granularity, recompute_modules=tuple(modules),
        recompute_method="uniform" if granularity == "full" else None,
        recompute_num_layers=1 if granularity == "full" else None,
        optimizer_cpu_offload=fraction > 0, optimizer_offload_fraction=fraction,
        # CPU offload runs through the precision-aware optimizer (megatron-core HybridDeviceOptimizer)
        use_precision_aware_optimizer=base.use_precision_aware_optimizer or fraction > 0,
        cuda_graph_impl=impl, cuda_graph_modules=graphs)


def _why_no_layout(request: TrainingRequest):
    """The first error of the checks on the layout the fixed wishes force (when no layout could be enumerated)."""
    from .checks import Finding

    model = get_model(request.model)
    tp, pp, cp, ep = request.tp or 1, request.pp or 1, request.cp or 1, request.ep or 1
    world = request.num_gpus
    lay = ParallelLayout(world=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=1)
    probe = Plan(name="probe", model=model.key, hardware=request.hardware, seq_length=request.seq_length, layout=lay,
                 pipeline_model_parallel_layout=None, micro_batch_size=1, global_batch_size=world,
                 precision="bf16", moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend=None,
                 sequence_parallel=tp > 1)
    errors = [f for f in check_plan(probe) if f.severity == "error" and not f.rule.startswith(("batch/", "pipeline/"))]
    return errors[0] if errors else Finding("error", "rank-folding", "no TP/PP/CP/EP combination folds into "
                                            f"{world} GPUs for this model", "change the GPU count or the fixed wishes")


def plan(request: TrainingRequest, top: int = 5, progress=None) -> PlanResult:
    """Search the request's layouts; return the winner and the ``top`` fastest fitting ones.

    Args:
        progress: optional callable(done, total) called as layouts are evaluated (the CLI's progress bar).

    Raises:
        InfeasibleConfig: no layout is legal and fits, naming the constraint that rejected most of them.
    """
    layouts = enumerate_layouts(request)
    rejected: dict[str, int] = {}
    fits = []
    for i, lay in enumerate(layouts, 1):
        candidate = _plan_for(request, lay, rejected)
        if candidate is not None:
            fits.append(candidate)
        if progress is not None:
            progress(i, len(layouts))
    if not fits:
        asked = f"{request.model} at seq_length {request.seq_length} on {request.num_gpus} x {request.hardware}"
        if not layouts:
            finding = _why_no_layout(request)
            raise InfeasibleConfig(f"no layout for {asked}: {finding.message} ({finding.rule})", finding.fix)
        main = max(rejected, key=lambda k: rejected[k][0])
        raise InfeasibleConfig(
            f"no layout for {asked}: {len(layouts)} layouts considered, most rejected by {main} "
            f"({', '.join(f'{k}: {v[0]}' for k, v in sorted(rejected.items(), key=lambda kv: -kv[1][0]))})",
            rejected[main][1])
    fits.sort(key=lambda c: c.step.step_seconds)
    fastest = fits[0].step.step_seconds
    near = [c for c in fits if c.step.step_seconds <= fastest * (1 + KEEP_DP_SLACK)]
    best = max(near, key=lambda c: (c.plan.layout.dp, -c.step.step_seconds))
    dp_note = (f"; DP={best.plan.layout.dp} kept alive over a {fits[0].plan.layout.dp}-DP layout within "
               f"{KEEP_DP_SLACK:.0%}" if best is not fits[0] else "")
    squeeze = "; CP, EP, TP and PP squeeze DP to 1" if best.plan.layout.dp == 1 else ""
    why = (f"{best.plan.layout.describe()}: fastest predicted step ({best.step.step_seconds:.2f} s, "
           f"{best.step.tflops_per_gpu:.0f} TFLOP/s/GPU) among {len(fits)} fitting layouts of {len(layouts)}"
           f"{dp_note}{squeeze}")
    reasons = {**best.plan.reasons, "layout": Reason(why, "lcmoe_recipes planner: checks + cost model")}
    name = f"{request.model}_{request.seq_length // 1024}k_{request.num_gpus}x{request.hardware}"
    best = Candidate(best.plan.with_changes(reasons=reasons, name=name), best.memory, best.step)
    ranked = [best] + [c for c in fits if c.plan.layout != best.plan.layout][: max(0, top - 1)]
    return PlanResult(request, best, ranked, len(layouts), {k: v[0] for k, v in rejected.items()}, why)


# --- command line: python -m lcmoe_recipes.plan ---------------------------------------------------------------

TABLE_COLUMNS = ("rank", "TP", "CP", "EP", "PP", "VPP", "DP", "EDP", "recompute", "offload", "memory GiB",
                 "TP s", "CP s", "EP s", "DP s", "bubble s", "step s", "TFLOP/s", "MFU")


def table_records(result: PlanResult) -> list[dict]:
    """One record per ranked candidate, numbers unformatted (GiB, seconds per step, TFLOP/s, MFU as a fraction)."""
    records = []
    for i, c in enumerate(result.ranked, 1):
        lay, p, parts = c.plan.layout, c.plan, c.step.parts
        rec = "full" if p.recompute_granularity == "full" else ("+".join(p.recompute_modules) or "none")
        records.append({"rank": i, "TP": lay.tp, "CP": lay.cp, "EP": lay.ep, "PP": lay.pp, "VPP": lay.vpp or 1,
                        "DP": lay.dp, "EDP": lay.edp, "recompute": rec, "offload": p.optimizer_offload_fraction,
                        "memory GiB": c.memory.total / 2**30, "TP s": parts["tp_exposed"], "CP s": parts["cp_exposed"],
                        "EP s": parts["ep_exposed"], "DP s": parts["dp_exposed"], "bubble s": parts["bubble"],
                        "step s": c.step.step_seconds, "TFLOP/s": c.step.tflops_per_gpu, "MFU": c.step.mfu})
    return records


def table_rows(result: PlanResult) -> list[tuple]:
    """:func:`table_records` formatted for the text table and the CSV."""
    formats = {"offload": "{:g}", "memory GiB": "{:.1f}", "TP s": "{:.2f}", "CP s": "{:.2f}", "EP s": "{:.2f}",
               "DP s": "{:.2f}", "bubble s": "{:.2f}", "step s": "{:.2f}", "TFLOP/s": "{:.0f}", "MFU": "{:.1%}"}
    return [tuple(formats[k].format(v) if k in formats else v for k, v in r.items()) for r in table_records(result)]


def format_table(result: PlanResult, markdown: bool = False) -> str:
    """The decision table as aligned text (or Markdown)."""
    rows = [tuple(str(x) for x in TABLE_COLUMNS)] + [tuple(str(x) for x in r) for r in table_rows(result)]
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows)


def format_result(result: PlanResult) -> str:
    """Decision table, the winner's knobs with their reasons, and what was rejected."""
    best = result.best
    out = [f"{result.request.model} at seq_length {result.request.seq_length} on {result.request.num_gpus} x "
           f"{result.request.hardware}: {result.considered} layouts considered, {len(result.ranked)} shown "
           "(exposed seconds per step by collective)", format_table(result), "", f"winner: {result.why}",
           f"  pipeline layout {best.plan.pipeline_model_parallel_layout or 'none'}, MBS {best.plan.micro_batch_size} "
           f"GBS {best.plan.global_batch_size}, {best.plan.precision}, {best.plan.moe_token_dispatcher_type}"
           + (f" + {best.plan.moe_flex_dispatcher_backend}" if best.plan.moe_flex_dispatcher_backend else "")]
    out += [f"  - {knob}: {r.why} [{r.source}]" for knob, r in best.plan.reasons.items()]
    if result.rejected:
        out.append("rejected: " + ", ".join(f"{k} {v}" for k, v in sorted(result.rejected.items(), key=lambda kv: -kv[1])))
    return "\n".join(out)


def write_csv(result: PlanResult, path) -> None:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(TABLE_COLUMNS)
        writer.writerows(table_rows(result))


def request_arguments(parser, wishes_only: bool = False, required: bool = False) -> None:
    """The TrainingRequest flags shared by `plan` and `launch` (which has its own --gpus/--hardware/--precision)."""
    if not wishes_only:
        parser.add_argument("--gpus", type=int, metavar="N", required=required, help="GPU count (num_gpus)")
        parser.add_argument("--hardware", metavar="NAME", required=required,
                            help="GPU type: h100, h200, b200, gb200, gb300")
        parser.add_argument("--precision", help="bf16, fp8_blockwise, fp8_cs or mxfp8 (default: by hardware)")
    parser.add_argument("--model-config", metavar="PATH", help="your model's Hugging Face config.json (or a folder "
                        "holding one), instead of a catalogue MODEL: any architecture megatron-bridge can build")
    parser.add_argument("--gbs", type=int, help="global batch size (default: ~4-8M tokens per step)")
    parser.add_argument("--mbs", type=int, default=1, help="micro batch size (default 1)")
    parser.add_argument("--dispatcher", help="deepep, hybridep or alltoall (default: by hardware)")
    for name in ("tp", "pp", "cp", "ep"):
        parser.add_argument(f"--{name}", type=int, help=f"fix {name.upper()}")
    parser.add_argument("--no-offload", action="store_true", help="never offload optimizer state to the CPU")
    parser.add_argument("--variable-length", action="store_true", help="packed / variable-length batches")
    run_arguments(parser)


def run_arguments(parser) -> None:
    """The per-run options of any plan, named recipe or planned (:class:`lcmoe_recipes.rules.extension.RunOptions`)."""
    from .rules.positions import ROPE_CHOICES

    parser.add_argument("--rope", choices=ROPE_CHOICES, default="auto", help="positions: auto (keep RoPE when "
                        "seq_length fits the trained range, else YaRN), yarn, abf (raise the RoPE base) or keep")
    parser.add_argument("--tokens-per-step", type=int, metavar="N", help="tokens per optimizer step; GBS follows "
                        "(default: the base model's pre-training batch where published, DeepSeek-V3 63M; else ~8M "
                        "tokens above 100B parameters, ~4M below)")
    parser.add_argument("--lr", type=float, help="learning rate of the phase (default: the base model's final LR, "
                        "constant after a short warm-up)")
    parser.add_argument("--train-iters", type=int, metavar="N", help="optimizer steps of the phase (default 1000)")


def request_from_args(model: str, seq: int, args) -> TrainingRequest:
    """A TrainingRequest from parsed flags; pydantic's errors become one LcmoeError naming every bad field."""
    from pydantic import ValidationError

    from .errors import LcmoeError

    if getattr(args, "model_config", None):
        if model and get_model(model).key != get_model(args.model_config).key:  # both given: they must agree
            raise LcmoeError(f"MODEL '{model}' and --model-config '{args.model_config}' name different models",
                             "give one of them")
        model = get_model(args.model_config).key  # loads and registers the file (ModelConfigError when bad)
    if not model:
        raise LcmoeError("no model given", "give a catalogue MODEL or --model-config PATH")
    from .catalog.user import looks_like_path

    if looks_like_path(model):
        model = get_model(model).key  # a config.json given as MODEL: a bad file raises ModelConfigError itself
    try:
        return TrainingRequest(model=model, seq_length=seq, hardware=args.hardware, num_gpus=args.gpus,
                               precision=args.precision, global_batch_size=args.gbs, micro_batch_size=args.mbs,
                               dispatcher=args.dispatcher, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep,
                               allow_cpu_offload=not args.no_offload, variable_length=args.variable_length,
                               rope=args.rope, tokens_per_step=args.tokens_per_step, lr=args.lr,
                               train_iters=args.train_iters,
                               pretrained_checkpoint=getattr(args, "pretrained_checkpoint", None))
    except ValidationError as exc:
        bad = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'request'}: {e['msg'].removeprefix('Value error, ')}"
                        for e in exc.errors())
        raise LcmoeError(f"invalid request: {bad}", "see --help for the valid values") from None


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    from .errors import LcmoeError

    parser = argparse.ArgumentParser(
        prog="python -m lcmoe_recipes.plan", description="Plan a long-context MoE layout for any model, sequence "
        "length, GPU type and count: candidate layouts, per-GPU memory, exposed communication per collective, "
        "predicted step time and MFU, and why the winner won. Imports neither torch nor megatron.",
        epilog="example: python -m lcmoe_recipes.plan qwen3_235b --seq 65536 --gpus 64 --hardware gb200 --top 8")
    parser.add_argument("model", nargs="?", help="a catalogue model (" + ", ".join(MODELS) + "; aliases work), "
                        "or the path of a config.json; or give --model-config PATH")
    parser.add_argument("--seq", type=int, required=True, metavar="N", help="seq_length in tokens")
    request_arguments(parser, required=True)
    parser.add_argument("--top", type=int, default=5, help="candidates to show (default 5)")
    parser.add_argument("--csv", metavar="FILE", help="also write the decision table as CSV")
    parser.add_argument("--explain", action="store_true", help="also print the winner's every decision with its "
                        "reason and source, every finding with its fix, placement, memory and time breakdowns")
    parser.add_argument("--json", action="store_true", help="print JSON (table, winner explained, rejections) instead")
    parser.add_argument("--plot", metavar="DIR", help="write memory.png, time.png (the shown candidates side by "
                        "side) and sweep.png (4K-256K) into DIR")
    args = parser.parse_args(argv)
    try:
        if args.gpus is None or args.hardware is None:
            raise LcmoeError("--gpus and --hardware are required", "e.g. --gpus 64 --hardware gb200")
        if args.top < 1:
            raise LcmoeError(f"--top {args.top} shows nothing", "use --top 1 or more")
        request = request_from_args(args.model, args.seq, args)
        result = _search_with_progress(request, args.top, show=sys.stderr.isatty() and not args.json)
    except LcmoeError as exc:
        return exc.report()
    if args.json:
        import json

        from .explain import explain_json

        print(json.dumps({"why": result.why, "considered": result.considered, "rejected": result.rejected,
                          "candidates": table_records(result), "winner": explain_json(result.best.plan)},
                         indent=2, default=str))
    elif sys.stdout.isatty():
        from .explain import print_table

        print_table(TABLE_COLUMNS, table_rows(result), title=f"{request.model} at seq_length {request.seq_length} on "
                    f"{request.num_gpus} x {request.hardware}: {result.considered} layouts considered")
        print("\n".join(format_result(result).splitlines()[2:]))
    else:
        print(format_result(result))
    if args.explain and not args.json:
        from .explain import explain_text

        print("\n" + explain_text(result.best.plan))
    if args.csv:
        write_csv(result, args.csv)
        print(f"\nCSV: {args.csv}", file=sys.stderr if args.json else sys.stdout)
    if args.plot:
        from .plots import write_plots

        try:
            written = write_plots([c.plan for c in result.ranked], args.plot)
        except LcmoeError as exc:
            return exc.report()
        print("plots: " + ", ".join(str(p) for p in written), file=sys.stderr if args.json else sys.stdout)
    return 0


def _search_with_progress(request: TrainingRequest, top: int, show: bool) -> PlanResult:
    """plan() with a rich progress bar on a terminal when the search is long (more than 300 layouts)."""
    if not show or len(enumerate_layouts(request)) <= 300:
        return plan(request, top=top)
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("planning", total=None)
        return plan(request, top=top, progress=lambda done, total: bar.update(task, completed=done, total=total))
