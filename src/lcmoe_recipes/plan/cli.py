"""``python -m lcmoe_recipes.plan``: the search's command line (decision table, the winner's reasons, CSV, JSON,
--explain, --plot, and --compare / several --gpus side by side).

The search is :mod:`lcmoe_recipes.search`; the pictures are :mod:`lcmoe_recipes.plots`. This module calls both
(the search never draws, the plots never search).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..catalog import MODELS
from ..errors import LcmoeError, argument_parser
from ..request import TrainingRequest
from ..search import PlanResult, memory_limit, plan, seq_sweep
from . import Plan

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
    return _aligned(rows, markdown)


def _aligned(rows: list[tuple[str, ...]], markdown: bool = False, labels: bool = False) -> str:
    """Rows as Markdown, or as text columns aligned right (the first left when it holds ``labels``)."""
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) if labels and i == 0 else v.rjust(w)
                                for i, (v, w) in enumerate(zip(r, widths))) for r in rows)


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


def write_plot_files(plans: list[Plan], folder: str | Path, request: TrainingRequest | None = None) -> list[Path]:
    """memory.png and time.png of ``plans`` side by side, and sweep.png: the search's pick from 4K to 256K for
    ``request`` (default: the first plan's model, hardware and GPU count) -- the search runs here, the plots
    module only draws.

    Raises:
        LcmoeError: matplotlib is missing.
    """
    from ..plots import write_plots

    first = plans[0]
    request = request or TrainingRequest(model=first.model, seq_length=first.seq_length, hardware=first.hardware,
                                         num_gpus=first.layout.world)
    sweep = [(seq, c.memory.total, c.step.tflops_per_gpu, c.plan.layout.cp) for seq, c in seq_sweep(request)]
    limit = memory_limit(first.model_spec, first.hardware_spec, request.memory_margin)
    return write_plots(plans, folder, limit, sweep)


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a GPU count or a comma-separated list of them "
                                         "(e.g. 256 or 256,512)")
    return counts


def request_arguments(parser, wishes_only: bool = False, required: bool = False) -> None:
    """The TrainingRequest flags shared by `plan` and `launch` (which has its own --gpus/--hardware/--precision)."""
    if not wishes_only:
        parser.add_argument("--gpus", type=_counts, metavar="N[,N...]", required=required,
                            help="GPU count (num_gpus); several, comma-separated, are planned side by side")
        parser.add_argument("--hardware", metavar="NAME", help="GPU type: h100, h200, b200, gb200, gb300")
        parser.add_argument("--precision", help="bf16, fp8_blockwise, fp8_cs or mxfp8 (default: by hardware)")
    parser.add_argument("--model-config", metavar="PATH", help="your model's Hugging Face config.json (or a folder "
                        "holding one), instead of a catalogue MODEL: any architecture megatron-bridge can build")
    parser.add_argument("--gbs", type=int, help="global batch size (default: --tokens-per-step / seq_length)")
    parser.add_argument("--mbs", type=int, default=1, help="micro batch size (default 1)")
    parser.add_argument("--dispatcher", help="deepep, hybridep or alltoall (default: by hardware)")
    for name in ("tp", "pp", "cp", "ep"):
        parser.add_argument(f"--{name}", type=int, help=f"fix {name.upper()}")
    parser.add_argument("--no-offload", action="store_true", help="never offload optimizer state to the CPU")
    parser.add_argument("--variable-length", action="store_true", help="packed / variable-length batches")
    parser.add_argument("--memory-margin", type=float, metavar="F", help="fraction of HBM the plan keeps free "
                        "(default 0.05: the predicted peak may reach 95%% of HBM), e.g. 0.1")
    run_arguments(parser)


def run_arguments(parser) -> None:
    """The per-run options of any plan, named recipe or planned (:class:`lcmoe_recipes.rules.extension.RunOptions`)."""
    from ..rules.positions import ROPE_CHOICES

    parser.add_argument("--rope", choices=ROPE_CHOICES, default="auto", help="positions: auto (keep RoPE when "
                        "seq_length fits the trained range, else YaRN), yarn, abf (raise the RoPE base) or keep")
    parser.add_argument("--tokens-per-step", type=int, metavar="N", help="tokens per optimizer step; GBS follows "
                        "(default: the base model's pre-training batch where published, DeepSeek-V3 63M; else ~8M "
                        "tokens above 100B parameters, ~4M below)")
    parser.add_argument("--lr", type=float, help="learning rate of the phase (default: the base model's final LR, "
                        "constant after a short warm-up)")
    parser.add_argument("--train-iters", type=int, metavar="N", help="optimizer steps of the phase (default 1000)")


def request_from_args(model: str, seq: int, args, **target) -> TrainingRequest:
    """A TrainingRequest from parsed flags (``target`` overrides hardware / num_gpus / precision); pydantic's errors
    become one LcmoeError naming every bad field."""
    from pydantic import ValidationError

    from ..catalog import get_model
    from ..catalog.user import looks_like_path

    if getattr(args, "model_config", None):
        if model and get_model(model).key != get_model(args.model_config).key:  # both given: they must agree
            raise LcmoeError(f"MODEL '{model}' and --model-config '{args.model_config}' name different models",
                             "give one of them")
        model = get_model(args.model_config).key  # loads and registers the file (ModelConfigError when bad)
    if not model:
        raise LcmoeError("no model given", "give a catalogue MODEL or --model-config PATH")
    if looks_like_path(model):
        model = get_model(model).key  # a config.json given as MODEL: a bad file raises ModelConfigError itself
    fields = dict(model=model, seq_length=seq, hardware=args.hardware, num_gpus=args.gpus,
                  precision=args.precision, global_batch_size=args.gbs, micro_batch_size=args.mbs,
                  dispatcher=args.dispatcher, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep,
                  allow_cpu_offload=not args.no_offload, variable_length=args.variable_length,
                  rope=args.rope, tokens_per_step=args.tokens_per_step, lr=args.lr, train_iters=args.train_iters,
                  pretrained_checkpoint=getattr(args, "pretrained_checkpoint", None))
    if getattr(args, "memory_margin", None) is not None:
        fields["memory_margin"] = args.memory_margin
    try:
        return TrainingRequest(**{**fields, **target})
    except ValidationError as exc:
        parts, fixes = [], []
        for e in exc.errors():
            text = e["msg"].removeprefix("Value error, ")
            if "; use " in text:  # the validator names the fix: say it once, as the fix
                text, _, fix = text.rpartition("; ")
                fixes.append(fix)
            where = ".".join(str(x) for x in e["loc"])
            parts.append(f"{where}: {text}" if where else text)
        raise LcmoeError(f"invalid request: {'; '.join(parts)}", "; ".join(fixes) or "see --help for the valid values"
                         ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(
        prog="python -m lcmoe_recipes.plan", description="Plan a long-context MoE layout for any model, sequence\n"
        "length, GPU type and count: candidate layouts, per-GPU memory, exposed communication per\n"
        "collective, predicted step time and MFU, and why the winner won. Imports neither torch nor\n"
        "megatron.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python -m lcmoe_recipes.plan qwen3_235b --seq 65536 --gpus 64 --hardware gb200 --top 8\n"
               "  python -m lcmoe_recipes.plan dsv3 --seq 131072 --gpus 256 --compare h100,gb200\n"
               "  python -m lcmoe_recipes.plan dsv3 --seq 131072 --gpus 256,512,1024 --hardware h100 --json")
    parser.add_argument("model", nargs="?", help="a catalogue model (" + ", ".join(MODELS) + "; aliases work), "
                        "or the path of a config.json; or give --model-config PATH")
    parser.add_argument("--seq", type=int, required=True, metavar="N", help="seq_length in tokens")
    request_arguments(parser, required=True)
    parser.add_argument("--compare", metavar="HW[,HW...]", help="GPU types to plan side by side (instead of "
                        "--hardware), at one precision: e.g. h100,gb200")
    parser.add_argument("--top", type=int, default=5, help="candidates to show (default 5)")
    parser.add_argument("--csv", metavar="FILE", help="also write the decision table as CSV")
    parser.add_argument("--explain", action="store_true", help="also print the winner's every decision with its "
                        "reason and source, every finding with its fix, placement, memory and time breakdowns")
    parser.add_argument("--json", action="store_true", help="print JSON (table, winner explained, rejections) instead")
    parser.add_argument("--plot", metavar="DIR", help="write memory.png, time.png (the shown candidates side by "
                        "side) and sweep.png (4K-256K) into DIR")
    args = parser.parse_args(argv)
    try:
        if args.top < 1:
            raise LcmoeError(f"--top {args.top} shows nothing", "use --top 1 or more")
        hardware = _hardware_list(args)
        if len(hardware) * len(args.gpus) > 1:
            return _compare_main(args, hardware)
        request = request_from_args(args.model, args.seq, args, hardware=hardware[0], num_gpus=args.gpus[0])
        result = plan(request, top=args.top)
    except LcmoeError as exc:
        return exc.report()
    if args.json:
        import json

        from ..explain import explain_json

        print(json.dumps({"why": result.why, "considered": result.considered, "evaluated": result.evaluated,
                          "pruned": result.pruned, "rejected": result.rejected, "candidates": table_records(result),
                          "winner": explain_json(result.best.plan)}, indent=2, default=str))
    elif sys.stdout.isatty():
        from ..explain import print_table

        print_table(TABLE_COLUMNS, table_rows(result), title=f"{request.model} at seq_length {request.seq_length} on "
                    f"{request.num_gpus} x {request.hardware}: {result.considered} layouts considered")
        print("\n".join(format_result(result).splitlines()[2:]))
    else:
        print(format_result(result))
    if args.explain and not args.json:
        from ..explain import explain_text

        print("\n" + explain_text(result.best.plan))
    if args.csv:
        write_csv(result, args.csv)
        print(f"\nCSV: {args.csv}", file=sys.stderr if args.json else sys.stdout)
    if args.plot:
        try:
            written = write_plot_files([c.plan for c in result.ranked], args.plot, request)
        except LcmoeError as exc:
            return exc.report()
        print("plots: " + ", ".join(str(p) for p in written), file=sys.stderr if args.json else sys.stdout)
    return 0


def _hardware_list(args) -> list[str]:
    """The GPU types asked for: --hardware, or the --compare list (not both).

    Raises:
        LcmoeError: neither or both given, or an unknown GPU type (with the closest name).
    """
    from ..catalog import get_hardware

    if args.compare and args.hardware:
        raise LcmoeError("--hardware and --compare both name the GPU type", "give --compare h100,gb200 alone, or "
                         "--hardware NAME alone")
    if not (args.compare or args.hardware):
        raise LcmoeError("--hardware (or --compare) is required", "e.g. --hardware gb200, or --compare h100,gb200")
    names = [x.strip() for x in (args.compare or args.hardware).split(",") if x.strip()]
    return list(dict.fromkeys(get_hardware(n).key for n in names))


def _compare_main(args, hardware: list[str]) -> int:
    """--compare / several --gpus: the winners side by side at one precision, as a table or JSON."""
    from ..catalog import get_hardware
    from .compare import common_precision, compare, column_record, format_columns

    for flag, given in (("--csv", args.csv), ("--plot", args.plot), ("--explain", args.explain)):
        if given:
            raise LcmoeError(f"{flag} works on one target, not on a comparison",
                             f"drop {flag}, or plan one --hardware and one --gpus count with it")
    from ..catalog import get_model

    first = request_from_args(args.model, args.seq, args, hardware=hardware[0], num_gpus=args.gpus[0])
    precision, why = common_precision(get_model(first.model), [get_hardware(h) for h in hardware], args.precision)
    requests = [request_from_args(first.model, args.seq, args, hardware=h, num_gpus=n, precision=precision)
                for h in hardware for n in args.gpus]
    columns = compare(requests)
    if args.json:
        import json

        print(json.dumps({"model": requests[0].model, "seq_length": args.seq, "precision": precision,
                          "precision_reason": why, "targets": [column_record(c) for c in columns]},
                         indent=2, default=str))
        return 0
    header, rows = format_columns(columns)
    print(f"{requests[0].model} at seq_length {args.seq}: the search's winner per target, at {why}")
    print(_aligned([tuple(header)] + rows, labels=True))
    for c in columns:
        if c.result is None:
            print(f"{c.request.num_gpus} x {c.request.hardware}: {c.error.message}\n  fix: {c.error.fix}")
    return 0
