"""``python -m lcmoe_recipes.check CONFIG --gpus N --hardware NAME``: findings for a config, before anything is queued.

CONFIG is a ConfigContainer YAML (ours, upstream's or a user's) or a named recipe. For a YAML the target defaults to
the one recorded in its ``# lcmoe_recipes:`` header. Prints the layout, where each parallel group sits (nodes,
NVLink blocks), the predicted memory per GPU, host memory per node and step time with their breakdowns, and every
finding (severity, rule, message, fix) -- including a layout predicted not to fit in HBM or in a node's RAM and, for
a YAML, the known upstream bugs that apply to it for the versions it will run with (the installed ones, or
``--container-image``'s). ``--known-issues`` lists that catalogue (docs/known_issues.md).

Exit codes: 0 no errors (warnings allowed) · 1 errors found · 2 bad input (missing file, unknown hardware).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from .catalog import HARDWARE, get_hardware, load_model_config
from .checks import Finding
from .checks.feasibility import layout_is_legal
from .checks.known_issues import catalogue_rows, stack_versions
from .errors import LcmoeError, argument_parser
from .explain import all_findings
from .plan import Plan
from .ranks import placement
from .recipes import NAMED_RECIPES, recipe_plan


def format_costs(plan: Plan) -> str:
    """GPU memory breakdown (GiB per component), host memory per node (GiB per term) and step-time breakdown
    (seconds per cause, bytes per collective)."""
    from .cost import estimate_host_memory, estimate_memory, estimate_step

    mem, step, host = estimate_memory(plan), estimate_step(plan), estimate_host_memory(plan)
    gib, host_gib = mem.gib(), host.gib()
    lines = [f"memory per GPU (PP rank {mem.pp_rank}, the most loaded), GiB: "
             + ", ".join(f"{k} {v:.1f}" for k, v in gib.items() if k != "total")
             + f" = {gib['total']:.1f} of {plan.hardware_spec.hbm_gib:.0f}"]
    lines.append(f"host memory per node (node {host.node}, {host.ranks} ranks, the most loaded), GiB: "
                 + ", ".join(f"{k} {v:.1f}" for k, v in host_gib.items() if k != "total")
                 + f" = {host_gib['total']:.1f} of {plan.hardware_spec.host_memory_gib:.0f}")
    lines.append(f"step {step.step_seconds:.2f} s: " + ", ".join(f"{k} {v:.2f}" for k, v in step.parts.items() if v > 0))
    lines.append("traffic per GPU per step, GB: " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in step.comm_bytes.items()
                                                            if v > 0))
    lines.append(f"predicted {step.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, {step.tflops_per_gpu:.0f} TFLOP/s/GPU, "
                 f"MFU {step.mfu:.1%} (of {plan.hardware_spec.peak(plan.precision):.0f} TFLOP/s dense {plan.precision})")
    return "\n".join(lines)


def format_findings(plan: Plan, findings: list[Finding]) -> str:
    """Layout, group placement and findings as text."""
    hw, lay = plan.hardware_spec, plan.layout
    lines = [f"{plan.name}: {lay.describe()} x {hw.display} ({hw.gpus_per_node} GPUs per node; NVLink domain "
             f"{hw.nvlink_domain}, placed in blocks of {hw.job_block})"]
    if not any(f.rule.startswith("rank-folding") for f in findings):
        lines.append("  group  size  nodes spanned  NVLink blocks spanned   (megatron-core rank order tp-cp-ep-dp-pp)")
        for kind, (size, nodes, blocks) in placement(lay, hw.gpus_per_node, hw.job_block).items():
            lines.append(f"  {kind:<5} {size:>5} {nodes:>14} {blocks:>22}")
    if layout_is_legal(findings):
        lines.append(format_costs(plan))
    if not findings:
        lines.append("no findings")
    for f in findings:
        lines.append(f"{f.severity:<7} {f.rule}: {f.message}")
        lines.append(f"        fix: {f.fix}")
    errors = sum(f.severity == "error" for f in findings)
    lines.append(f"{errors} error(s), {len(findings) - errors} warning(s)")
    return "\n".join(lines)


def list_known_issues(container_image: str | None = None) -> int:
    """Print the known-issue catalogue with whether the installed (or the container's) versions are affected."""
    versions, notes = stack_versions(container_image)
    rows = catalogue_rows(versions)
    print(f"{len(rows)} known upstream bugs (docs/known_issues.md); 'these versions' = {versions.describe()}")
    for note in notes:
        print(f"{note.severity} {note.rule}: {note.message}\n        fix: {note.fix}")
    for issue_id, severity, affected, applies, title, urls in rows:
        print(f"\n{severity:<7} {issue_id}: {affected}; these versions affected: {applies}")
        print(f"        {title}")
        print(f"        {'  '.join(urls)}")
    print("\nA config gets a finding only when its fields also match the entry's trigger: "
          "python -m lcmoe_recipes.check CONFIG.yaml [--container-image IMAGE]")
    return 0


def edits_of_named_recipe(cfg, meta: dict) -> list[tuple[str, object, object]]:
    """(field path, the named recipe's value, this config's) for every field of ``cfg`` that differs from the named
    recipe its header names, built with the header's options and with its overrides applied ([] for a YAML of no
    named recipe)."""
    name = meta.get("recipe")
    if name not in NAMED_RECIPES or meta.get("retargeted_from"):
        return []
    from . import emit
    from .emit.settings import flat_fields

    try:
        reference = emit.build_config(recipe_plan(name, **meta.get("options", {})), validate=False)
    except LcmoeError:  # options this version does not know: nothing to compare against
        return []
    if meta.get("overrides"):
        emit.apply_overrides(reference, list(meta["overrides"]))
    ours, theirs = flat_fields(cfg), flat_fields(reference)
    missing = "(absent)"
    return [(path, theirs.get(path, missing), ours.get(path, missing)) for path in sorted(set(ours) | set(theirs))
            if str(ours.get(path, missing)) != str(theirs.get(path, missing))]


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(prog="python -m lcmoe_recipes.check", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="examples:\n  python -m lcmoe_recipes.check out/dsv3_128k_h100.yaml\n"
                                            "  python -m lcmoe_recipes.check my.yaml --gpus 256 --hardware h100\n"
                                            "  python -m lcmoe_recipes.check qwen3_235b_128k_gb200\n"
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
    parser.add_argument("--known-issues", action="store_true", help="list the known upstream bugs (id, severity, "
                        "affected versions, whether the installed or --container-image versions are affected, "
                        "source) and exit")
    parser.add_argument("--model-config", metavar="PATH", help="the config.json of the YAML's model when it is not "
                        "in the catalogue and the YAML has no lcmoe_recipes header carrying it")
    args = parser.parse_args(argv)
    if args.known_issues:
        return list_known_issues(args.container_image)
    try:
        if args.config is None:
            raise LcmoeError("no CONFIG given", "give a ConfigContainer YAML or a named recipe, or --known-issues")
        for flag, value in (("--gpus", args.gpus),):
            if value is not None and value < 1:
                raise LcmoeError(f"{flag} {value} is not a positive GPU count", "e.g. --gpus 256")
        hw_arg = get_hardware(args.hardware) if args.hardware else None  # fail fast, before any heavy import
        if args.model_config:
            load_model_config(args.model_config)  # a catalogue entry before the YAML is read back (bad file: exit 2)
        if args.config in NAMED_RECIPES and not Path(args.config).exists():
            plan = recipe_plan(args.config)
            if args.gpus or hw_arg:  # the same recipe on another target
                plan = plan.with_changes(layout=dataclasses.replace(plan.layout, world=args.gpus or plan.layout.world),
                                         hardware=(hw_arg or plan.hardware_spec).key)
            if args.container_image:
                raise LcmoeError(f"--container-image needs the ConfigContainer, not the named recipe "
                                 f"'{args.config}' (known upstream bugs are judged on its fields)",
                                 f"write it with python -m lcmoe_recipes.launch {args.config} --dry-run, then run "
                                 f"python -m lcmoe_recipes.check out/{args.config}.yaml --container-image "
                                 f"{args.container_image}")
            findings = all_findings(plan)
            scope = ("plan checks and the cost model (upstream validate() and the known upstream bugs run on YAML "
                     "files and in launch)")
        else:
            if not Path(args.config).is_file():
                if Path(args.config).suffix in (".yaml", ".yml") or "/" in args.config:
                    raise LcmoeError(f"config file '{args.config}' does not exist", "give the path of a "
                                     "ConfigContainer YAML, e.g. the out/<recipe>.yaml that launch --dry-run writes")
                import difflib

                close = difflib.get_close_matches(args.config, list(NAMED_RECIPES), n=1)
                raise LcmoeError(f"'{args.config}' is neither a file nor a named recipe",
                                 (f"did you mean '{close[0]}'? " if close else "")
                                 + f"give a ConfigContainer YAML, or one of: {', '.join(NAMED_RECIPES)}")
            from .emit.yaml_io import read_meta

            meta = read_meta(args.config)
            gpus, hardware = args.gpus or meta.get("world_size"), (hw_arg.key if hw_arg else meta.get("hardware"))
            missing = [flag for flag, value in (("--gpus N", gpus), ("--hardware NAME", hardware)) if not value]
            if missing:
                raise LcmoeError(f"'{args.config}' does not record its target", f"give {' and '.join(missing)}")
            hw = get_hardware(hardware)
            from . import emit

            cfg, _ = emit.read_yaml(args.config)
            name = meta.get("recipe") or Path(args.config).stem
            edited = edits_of_named_recipe(cfg, meta)
            if edited:
                name = f"{name} (edited)"
            plan = emit.plan_from_config(cfg, hw, gpus, name)
            versions, findings = stack_versions(args.container_image)  # an unlisted image: a warning
            findings = emit.config_findings(cfg, hw, gpus, name, versions) + findings
            if edited:
                shown = "; ".join(f"{path}: {before!r} -> {after!r}" for path, before, after in edited[:8])
                findings.append(Finding(
                    "warning", "config/edited-named-recipe",
                    f"'{args.config}' is labelled {meta['recipe']} but differs from that recipe (with the overrides "
                    f"its header lists) in {len(edited)} field(s): {shown}" + (" ..." if len(edited) > 8 else ""),
                    "intended edits need nothing more; the reasons shown for the recipe do not cover them"))
            if meta and (gpus, hw.key) != (meta.get("world_size"), meta.get("hardware")):
                findings.append(Finding(
                    "warning", "target/differs-from-header",
                    f"checking for {gpus} x {hw.key}, but the YAML was written for {meta.get('world_size')} x "
                    f"{meta.get('hardware')}: lcmoe_recipes.train refuses to start on a target other than the header's",
                    f"rewrite it for this target: python -m lcmoe_recipes.launch ... --gpus {gpus} --hardware {hw.key} --dry-run"))
            scope = (f"our checks, the cost model, megatron-bridge validate() for the target and the known upstream "
                     f"bugs for {versions.describe()}")
    except LcmoeError as exc:
        return exc.report()
    print(f"checked with {scope}")
    if sys.stdout.isatty() and layout_is_legal(findings):
        from .cost import estimate_host_memory, estimate_memory, estimate_step
        from .explain import print_table

        mem, step, host = estimate_memory(plan), estimate_step(plan), estimate_host_memory(plan)
        print_table(("component", "GiB"), [(k, f"{v:.1f}") for k, v in mem.gib().items()],
                    title=f"memory per GPU, PP rank {mem.pp_rank} (HBM {plan.hardware_spec.hbm_gib:.0f} GiB)")
        print_table(("component", "GiB"), [(k, f"{v:.1f}") for k, v in host.gib().items()],
                    title=f"host memory per node, node {host.node} (RAM {plan.hardware_spec.host_memory_gib:.0f} GiB)")
        print_table(("collective", "GB per GPU per step", "exposed s per step"),
                    [(k, f"{v / 1e9:.1f}", f"{step.parts.get(k.lower() + '_exposed', 0.0):.2f}")
                     for k, v in step.comm_bytes.items()], title=f"communication (step {step.step_seconds:.2f} s)")
    print(format_findings(plan, findings))
    return 1 if any(f.severity == "error" for f in findings) else 0


if __name__ == "__main__":
    sys.exit(main())
