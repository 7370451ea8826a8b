"""``python -m lcmoe_recipes.check CONFIG --gpus N --hardware NAME``: findings for a config, before anything is queued.

CONFIG is a ConfigContainer YAML (ours, upstream's or a user's) or a named recipe. For a YAML the target defaults to
the one recorded in its ``# lcmoe_recipes:`` header. Prints the layout, where each parallel group sits (nodes,
NVLink blocks), the predicted memory per GPU, host memory per node and step time with their breakdowns, and every
finding (severity, rule, message, fix) -- including a layout predicted not to fit in HBM or in a node's RAM,
megatron-bridge's own ``validate()`` for the target and the known upstream bugs that apply to the config for the
versions it will run with (the installed ones, or ``--container-image``'s); a named recipe is judged on its own
ConfigContainer, as its YAML would be. ``--known-issues`` lists that catalogue (docs/known_issues.md).

Exit codes: 0 no errors (warnings allowed) · 1 errors found · 2 bad input (missing file, unknown hardware).
"""

from __future__ import annotations

import argparse
import sys

from ..catalog import HARDWARE
from ..catalog.known_issues import STACK_COMPONENTS
from ..checks.feasibility import layout_is_legal
from ..checks.known_issues import catalogue_rows, stack_versions
from ..emit.stack import announce_loading
from ..errors import LcmoeError
from ..planner.examine import examine
from ..planner.recipes import NAMED_RECIPES
from ..report.text import format_findings
from .common import ArgumentParser, calibrated_line, effective_json, effective_text, read_back, report_error


def list_known_issues(container_image: str | None = None) -> int:
    """Print the known-issue catalogue with whether the installed (or the container's) versions are affected."""
    versions, notes = stack_versions(container_image)
    rows = catalogue_rows(versions)
    print(f"{len(rows)} known upstream bugs (docs/known_issues.md); 'these versions' = "
          f"{versions.describe(STACK_COMPONENTS)}")
    for note in notes:
        print(f"{note.severity} {note.rule}: {note.message}\n        fix: {note.fix}")
    for issue_id, severity, affected, applies, title, urls, architectures, components in rows:
        print(f"\n{severity:<7} {issue_id}: {affected}; these versions affected: {applies}")
        print(f"        {title}")
        print(f"        architectures: {architectures}; stack: {components}")
        print(f"        {'  '.join(urls)}")
    print("\nA config gets a finding only when its fields also match the entry's trigger: "
          "python -m lcmoe_recipes.check CONFIG.yaml [--container-image IMAGE]")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m lcmoe_recipes.check", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="examples:\n  python -m lcmoe_recipes.check out/dsv3_128k_h100.yaml\n"
                                            "  python -m lcmoe_recipes.check my.yaml --gpus 256 --hardware h100\n"
                                            "  python -m lcmoe_recipes.check qwen3_235b_128k_gb200\n"
                                            "  python -m lcmoe_recipes.check dsv3_128k_h100 --build\n"
                                            "  python -m lcmoe_recipes.check qwen3_235b_128k_gb200 --explain\n"
                                            "  python -m lcmoe_recipes.check out/dsv3_128k_h100.yaml --container-image "
                                            "nvcr.io/nvidia/nemo:26.06\n"
                                            "  python -m lcmoe_recipes.check --known-issues")
    parser.add_argument("config", nargs="?", help=f"ConfigContainer YAML file, or a named recipe "
                        f"({', '.join(NAMED_RECIPES)})")
    parser.add_argument("--gpus", type=int, help="target world size (default: the YAML header's or the recipe's)")
    parser.add_argument("--hardware", help=f"target GPU: {', '.join(HARDWARE)} (default: the YAML header's or the "
                        "recipe's)")
    parser.add_argument("--container-image", metavar="IMAGE", help="judge known upstream bugs for the versions in "
                        "this container (listed NGC NeMo images; default: the installed versions)")
    parser.add_argument("--calibration", metavar="PROFILE", help="also show the predictions with a calibration "
                        "profile's constants (lcmoe-calibrate) beside the published fit's")
    parser.add_argument("--no-overlay", action="store_true", help="with --container-image: judge the image's own "
                        "megatron-core / megatron-bridge (default: the pinned ones, which launch puts in an overlay "
                        "where the image's differ)")
    parser.add_argument("--explain", action="store_true", help="also print every effective value megatron derives "
                        "from the config (built on this CPU: the resolved config, one layer of each kind, the "
                        "optimizer, the scheduler, the dataset config) with what the config states and where the "
                        "value came from (section 'effective settings (read back from megatron)')")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of text: layout, "
                        "decisions, findings, memory, step, data and the effective settings (key 'effective')")
    parser.add_argument("--known-issues", action="store_true", help="list the known upstream bugs (id, severity, "
                        "affected versions, whether the installed or --container-image versions are affected, "
                        "source) and exit")
    parser.add_argument("--model-config", metavar="PATH", help="the config.json of the YAML's model when it is not "
                        "in the catalogue and the YAML has no lcmoe_recipes header carrying it")
    parser.add_argument("--build", action="store_true", help="also build megatron-core's real model of every "
                        "pipeline stage at the full world size on this CPU and compare its parameter and gradient "
                        "bytes with our memory model, stage by stage (docs/build.md; ~10-40 s)")
    args = parser.parse_args(argv)
    if args.known_issues:
        return list_known_issues(args.container_image)
    try:
        if args.config is None:
            raise LcmoeError("no CONFIG given", "give a ConfigContainer YAML or a named recipe, or --known-issues")
        announce_loading()  # megatron-bridge loads on the way (10-40 s): say so
        found = examine(args.config, args.gpus, args.hardware, args.container_image, args.model_config,
                        overlay=not args.no_overlay)
    except LcmoeError as exc:
        return report_error(exc, args.json)
    plan, findings = found.plan, found.findings
    if args.container_image:
        from ..jobs.overlay import compare_stack, format_stack, image_overlay

        print(format_stack(args.container_image, compare_stack(args.container_image, plan.hardware_spec.cpu_arch)),
              file=sys.stderr if args.json else sys.stdout)
        if not args.no_overlay:
            try:  # as launch: an image that cannot take the overlay of the pinned megatron is refused
                image_overlay(args.container_image, plan.hardware_spec.cpu_arch)
            except LcmoeError as exc:
                return report_error(exc, args.json)
    if args.json:
        return _print_json(found, args)
    print(f"checked with {found.scope}")
    print(f"data: {found.data}")
    if sys.stdout.isatty() and layout_is_legal(findings):
        from ..cost import estimate_host_memory, estimate_memory, estimate_step
        from ..report.explain import print_table

        mem, step, host = estimate_memory(plan), estimate_step(plan), estimate_host_memory(plan)
        print_table(("component", "GiB"), [(k, f"{v:.1f}") for k, v in mem.gib().items()],
                    title=f"memory per GPU, PP rank {mem.pp_rank} (HBM {plan.hardware_spec.hbm_gib:.0f} GiB)")
        print_table(("component", "GiB"), [(k, f"{v:.1f}") for k, v in host.gib().items()],
                    title=f"host memory per node, node {host.node} (RAM {plan.hardware_spec.host_memory_gib:.0f} GiB)")
        print_table(("collective", "GB per GPU per step", "exposed s per step"),
                    [(k, f"{v / 1e9:.1f}", f"{step.parts.get(k.lower() + '_exposed', 0.0):.2f}")
                     for k, v in step.comm_bytes.items()], title=f"communication (step {step.step_seconds:.2f} s)")
    print(format_findings(plan, findings))
    if args.explain:
        print("\n" + effective_text(_read_back(found, args)))
    if args.calibration:
        try:
            print(calibrated_line(plan, args.calibration))
        except LcmoeError as exc:
            return report_error(exc)
    built_ok = True
    if args.build and found.errors:
        print("\nbuild: not attempted -- fix the errors above first")
    elif args.build:
        from ..planner.examine import build_ranks

        report = build_ranks(args.config, plan.layout.world, plan.hardware_spec.key)
        print("\n" + report.table())
        built_ok = report.ok
    return 1 if found.errors or not built_ok else 0


def _read_back(found, args: argparse.Namespace):
    """:func:`lcmoe_recipes.cli.common.read_back` of the examined config (the check's own read-back, reused), or why
    not: a config with errors is not read back (megatron-bridge may refuse to build it; fix those first)."""
    if found.errors:
        return None, f"not read back: the {found.errors} error(s) above come first (each names its fix)"
    return read_back(found.cfg, found.plan.hardware_spec, found.plan.layout.world, args.container_image,
                     overlay=not args.no_overlay)


def _print_json(found, args: argparse.Namespace) -> int:
    """``--json``: the examination as one JSON document (:func:`lcmoe_recipes.report.explain.explain_json`, with
    ``valid``, ``scope``, ``data`` and ``effective``); --build's table goes to stderr. Returns the exit code."""
    import json

    from ..report.explain import explain_json

    doc = {**explain_json(found.plan, found.findings), "valid": not found.errors, "errors": found.errors,
           "scope": found.scope, "data": found.data, "effective": effective_json(_read_back(found, args))}
    built_ok = True
    if args.build and not found.errors:
        from ..planner.examine import build_ranks

        report = build_ranks(args.config, found.plan.layout.world, found.plan.hardware_spec.key)
        print(report.table(), file=sys.stderr)
        built_ok = report.ok
        doc["build_ok"] = built_ok
    print(json.dumps(doc, indent=2, default=str))
    return 1 if found.errors or not built_ok else 0
