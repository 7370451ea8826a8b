"""``python -m lcmoe_recipes.plan``: the search's command line (decision table, the winner's reasons, CSV, JSON,
--explain, --plot, and --compare / several --gpus side by side).

Thin: the flags become TrainingRequests (:func:`lcmoe_recipes.cli.common.request_from_args`), the search
(:mod:`lcmoe_recipes.planner.search`) and comparison (:mod:`lcmoe_recipes.report.compare`) answer them, :mod:`lcmoe_recipes.report.text`
formats the answer.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import LcmoeError
from ..planner.hazards import decides, describe, open_hazards
from ..planner.resolve import covering_recipe, named_plan, search
from ..report.text import (Citations, aligned, csv_table, format_result, json_records, table_columns, table_rows,
                           write_csv)
from .common import ArgumentParser, model_argument, report_error, request_arguments, request_from_args, write_plot_files


TOP = 5  # candidates shown by default
TIE_KEYS = ("layout", "mbs", "step_seconds", "headroom_gib", "keeps_memory_band", "winner", "dp", "passed_over")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m lcmoe_recipes.plan", description="Plan a long-context MoE layout for any model, sequence\n"
        "length, GPU type and count: candidate layouts, per-GPU memory, exposed communication per\n"
        "collective, predicted step time and MFU, and why the winner won. Imports neither torch nor\n"
        "megatron.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python -m lcmoe_recipes.plan qwen3_235b --seq 65536 --gpus 64 --hardware gb200 --top 8\n"
               "  python -m lcmoe_recipes.plan dsv3 --seq 131072 --gpus 256 --compare h100,gb200\n"
               "  python -m lcmoe_recipes.plan dsv3 --seq 131072 --gpus 256,512,1024 --hardware h100 --json")
    model_argument(parser)
    parser.add_argument("--seq", type=int, required=True, metavar="N", help="seq_length in tokens")
    request_arguments(parser, several_gpus=True)
    parser.add_argument("--compare", metavar="HW[,HW...]", help="GPU types to plan side by side (instead of "
                        "--hardware), at one precision: e.g. h100,gb200")
    parser.add_argument("--top", type=int, help=f"candidates to show (default {TOP}; one target only: a comparison "
                        "shows each target's winner)")
    parser.add_argument("--csv", metavar="FILE", help="also write the decision table as CSV (written before "
                        "anything is printed; '-': the CSV alone on stdout, for a pipe)")
    parser.add_argument("--explain", action="store_true", help="print every reason of the winner in full (the default "
                        "shows the decisions that matter, one line each), every finding with its fix, placement, "
                        "memory and time breakdowns")
    parser.add_argument("--json", action="store_true", help="print JSON (table, winner explained, rejections) instead")
    parser.add_argument("--plot", metavar="DIR", help="write memory.png, time.png (the shown candidates side by "
                        "side) and sweep.png (4K-256K) into DIR")
    args = parser.parse_args(argv)
    try:
        if args.top is not None and args.top < 1:
            raise LcmoeError(f"--top {args.top} shows nothing", "use --top 1 or more")
        hardware = _hardware_list(args)
        if len(hardware) * len(args.gpus) > 1:
            return _compare_main(args, hardware)
        args.top = args.top or TOP
        request = request_from_args(args, hardware=hardware[0], num_gpus=args.gpus[0])
        result = search(request, top=args.top)
        calibrated = request.calibration is not None
        named = covering_recipe(request)
    except LcmoeError as exc:
        return report_error(exc, args.json)  # --json: the error and its fix as JSON on stdout
    if args.csv == "-":  # the CSV alone, for a pipe
        import csv

        csv.writer(sys.stdout, lineterminator="\n").writerows(csv_table(result, calibrated))
        return 0
    if args.csv:  # first: a reader that closes the pipe early (| head) does not lose the file
        write_csv(result, args.csv, calibrated)
    citations = Citations()
    if args.json:
        import json

        from ..report.explain import explain_json

        print(json.dumps({"why": result.why, "considered": result.considered, "evaluated": result.evaluated,
                          "pruned": result.pruned, "rejected": result.rejected,
                          "candidates": json_records(result, calibrated), "rule": result.rule,
                          "rules": list(result.rules), "band": result.band,
                          "band_reason": result.band_reason, "limit_gib": result.limit / 2**30,
                          "tie_break": [dict(zip(TIE_KEYS, (t.layout, t.mbs, t.step, t.headroom / 2**30, t.safe,
                                                            t.winner, t.dp, t.passed_over)))
                                        for t in result.tie_break],
                          "tp_note": result.tp_note, "named_recipe": named.name if named else None,
                          "winner": explain_json(result.best.plan)}, indent=2, default=str))
    elif sys.stdout.isatty():
        from ..report.explain import print_table

        print_table(table_columns(calibrated), table_rows(result, calibrated), title=f"{request.model} at seq_length {request.seq_length} on "
                    f"{request.num_gpus} x {request.hardware}: {result.considered} layouts considered")
        print("\n".join(format_result(result, citations, args.explain, calibrated).splitlines()[2:]))
    else:
        print(format_result(result, citations, args.explain, calibrated))
    if named is not None and not args.json:
        print("\n" + _named_note(named, request, result.best))
    if args.explain and not args.json:
        from ..report.explain import explain_text

        print("\n" + explain_text(result.best.plan, citations=citations, with_decisions=False))
    if not args.json and (sources := citations.listing()):
        print(sources)
    if args.csv:
        print(f"\nCSV: {args.csv}", file=sys.stderr if args.json else sys.stdout)
    if args.plot:
        try:
            written = write_plot_files([c.plan for c in result.ranked], args.plot, request)
        except LcmoeError as exc:
            return report_error(exc)
        print("plots: " + ", ".join(str(p) for p in written), file=sys.stderr if args.json else sys.stdout)
    return 0


SLOWER_NOTED = 1.5  # a named recipe predicted this many times the winner's step is called out (a fresh user's 4x)


def _named_note(named, request, best) -> str:
    """The note that the named recipe ``named`` answers ``request`` at launch (with the request's precision and run
    options, as launch applies them), with its predicted step beside the search winner's ``best``; where it is
    predicted :data:`SLOWER_NOTED` times slower or more, that is said first."""
    from ..cost import estimate_step

    name, plan = named.name, named_plan(named, request)
    ours, theirs = best.step.step_seconds, estimate_step(plan).step_seconds
    gbs, own_gbs = best.plan.global_batch_size, plan.global_batch_size
    slower = (theirs / own_gbs) / (ours / gbs)  # per sequence: the two may batch differently
    text = (f"note: the named recipe {name} covers this request, and launch uses it ({plan.layout.describe()}, "
            f"predicted {theirs:.2f} s per step against the search winner's {ours:.2f} s"
            + (f", at GBS {own_gbs} against {gbs}" if own_gbs != gbs else "")
            + "): it follows upstream's recipe, where this table ranks layouts by the cost model alone")
    if slower >= SLOWER_NOTED:
        text += (f"; the cost model predicts it {slower:.1f}x slower per sequence than the winner -- measure both "
                 "before a long run (the model's error on held-out rows: docs/accuracy.md)")
    avoided = [h for h in open_hazards(plan) if h not in open_hazards(best.plan) and decides(h)]
    if avoided:  # e.g. DeepSeek-V3 128K: upstream's CPU offload and its checkpoint bug, where a layout fits without
        text += ("; it walks into open upstream bug(s) the winner avoids: " + ", ".join(map(describe, avoided))
                 + " (docs/known_issues.md)")
    return text + f"; to launch the search's answer instead, give its layout as wishes ({_wishes(best.plan)})"


def _wishes(plan) -> str:
    """The layout wishes that make launch search for ``plan``'s layout (TP, PP, CP, EP and MBS; VPP, ETP and the
    rest follow from them as the search decides them)."""
    lay = plan.layout
    return f"--tp {lay.tp} --pp {lay.pp} --cp {lay.cp} --ep {lay.ep} --mbs {plan.micro_batch_size}"


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
    from ..catalog import get_hardware, get_model
    from ..report.compare import column_record, common_precision, compare, format_columns

    for flag, given in (("--csv", args.csv), ("--plot", args.plot), ("--explain", args.explain),
                        ("--top", args.top is not None)):
        if given:
            raise LcmoeError(f"{flag} works on one target, not on a comparison",
                             f"drop {flag}, or plan one --hardware and one --gpus count with it")
    first = request_from_args(args, hardware=hardware[0], num_gpus=args.gpus[0])
    precision, why = common_precision(get_model(first.model), [get_hardware(h) for h in hardware], args.precision)
    requests = [first.replace(hardware=h, num_gpus=n, precision=precision) for h in hardware for n in args.gpus]
    columns = compare(requests)
    if args.json:
        import json

        print(json.dumps({"model": requests[0].model, "seq_length": args.seq, "precision": precision,
                          "precision_reason": why, "targets": [column_record(c) for c in columns]},
                         indent=2, default=str))
        return 0
    header, rows = format_columns(columns)
    print(f"{requests[0].model} at seq_length {args.seq}: the search's winner per target, at {why}")
    print(aligned([tuple(header)] + rows, labels=True))
    for c in columns:
        if c.result is None:
            print(f"{c.request.num_gpus} x {c.request.hardware}: {c.error.message}\n  fix: {c.error.fix}")
        elif (named := covering_recipe(c.request)) is not None:  # as for one target: launch uses the recipe there
            print(f"{c.request.num_gpus} x {c.request.hardware}: " + _named_note(named, c.request, c.result.best))
    return 0
