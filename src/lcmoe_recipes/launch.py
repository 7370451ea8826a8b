"""The main job: ``python -m lcmoe_recipes.launch MODEL --seq N [...] [Hydra overrides...]``.

Picks the named recipe for (MODEL, seq_length[, GPUs, hardware]), builds its megatron-bridge ConfigContainer,
applies Hydra overrides with megatron-bridge's override utilities, checks the result again for the target
(our checks + upstream validation), prints a summary, writes the ConfigContainer YAML and the torchrun command.

Exit codes: 0 done; 2 bad input (nothing written); 1 valid config but it cannot run on this machine (no GPU /
too few GPUs): the YAML is written and the cluster command printed.
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import sys
from pathlib import Path

from .catalog import HARDWARE, MODELS
from .errors import LcmoeError, UnknownName
from .plan import PRECISIONS, Plan, Reason, carry_reasons
from .planner import request_arguments, request_from_args
from .recipes import NAMED_RECIPES, find_named_recipe, recipe_plan

EPILOG = """\
examples:
  python -m lcmoe_recipes.launch qwen3_235b --seq 131072 --dry-run
  python -m lcmoe_recipes.launch dsv3 --seq 262144 --gpus 512 --hardware h100 --dry-run --output dsv3_256k.yaml
  python -m lcmoe_recipes.launch qwen3_235b --seq 131072 model.tensor_model_parallel_size=8 --dry-run
  python -m lcmoe_recipes.launch qwen3_next --seq 65536 train.global_batch_size=128 '+env_vars.NCCL_DEBUG=INFO' --dry-run
  python -m lcmoe_recipes.launch qwen3_235b --seq 65536 --gpus 64 --hardware gb200 --dry-run   (planned)
  python -m lcmoe_recipes.launch --list

overrides use Hydra syntax on the ConfigContainer: key=value, +key=value (add), ~key (delete; resets a field to
its default). Keys are megatron-bridge field names, e.g. model.context_parallel_size, train.global_batch_size,
optimizer.optimizer_offload_fraction, model.recompute_modules=[layernorm,moe_act].
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lcmoe_recipes.launch",
        description="Build, validate and launch a long-context MoE training config (megatron-bridge ConfigContainer).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help=f"model ({', '.join(MODELS)}; aliases such as deepseek_v3 work) "
                                                 "or a named recipe (see --list)")
    parser.add_argument("--seq", type=int, metavar="N", help="sequence length in tokens (seq_length), e.g. 131072")
    parser.add_argument("--gpus", type=int, metavar="N", help="GPU count (default: the named recipe's)")
    parser.add_argument("--hardware", metavar="NAME", help=f"GPU type: {', '.join(HARDWARE)} (default: the recipe's)")
    parser.add_argument("--precision", choices=list(PRECISIONS), help="override the recipe's precision "
                        "(e.g. mxfp8 for qwen3_235b on GB200)")
    parser.add_argument("--dry-run", action="store_true", help="print the summary, write the YAML and print the "
                        "torchrun command; do not launch")
    parser.add_argument("--output", metavar="FILE", help="where to write the ConfigContainer YAML "
                        "(default: out/<recipe>.yaml; with overrides out/<recipe>+<hash of the overrides>.yaml)")
    parser.add_argument("--list", action="store_true", help="list the named recipes and exit")
    parser.add_argument("--explain", action="store_true", help="also print every decision with its reason and "
                        "source, every finding with its fix, placement, memory and time breakdowns")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (decisions, findings, memory, "
                        "step, YAML path, cluster command) instead of text")
    parser.add_argument("--plot", metavar="DIR", help="write memory.png, time.png and sweep.png (4K-256K) into DIR")
    request_arguments(parser.add_argument_group("planning (requests that match no named recipe)"), wishes_only=True)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model.tensor_model_parallel_size=4")
    return parser


def list_recipes() -> str:
    """The named recipes as a table."""
    lines = [f"{'recipe':<24} {'model':<11} {'seq':>7} {'GPUs':>5} {'hardware':<8} summary"]
    for r in NAMED_RECIPES.values():
        lines.append(f"{r.name:<24} {r.model:<11} {r.seq_length:>7} {r.num_gpus:>5} {r.hardware:<8} {r.summary}")
    return "\n".join(lines)


def torchrun_command(yaml_path: str | Path, world_size: int, gpus_per_node: int) -> str:
    """The command every node of the cluster runs (one torchrun per node; under Slurm: ``srun --ntasks-per-node 1``).

    Raises:
        LcmoeError: ``world_size`` does not fill whole nodes.
    """
    if world_size % gpus_per_node:
        lower = world_size - world_size % gpus_per_node
        raise LcmoeError(f"{world_size} GPUs do not fill whole nodes of {gpus_per_node}",
                         f"use {lower or gpus_per_node} or {lower + gpus_per_node} GPUs")
    nodes = world_size // gpus_per_node
    return (f"torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} --rdzv-backend c10d "
            f"--rdzv-endpoint \"$MASTER_ADDR:${{MASTER_PORT:-29500}}\" -m lcmoe_recipes.train "
            f"--config {shlex.quote(str(yaml_path))}")


def resolve_plan(model: str | None, seq: int | None, gpus: int | None, hardware: str | None,
                 precision: str | None = None, wishes=None) -> Plan:
    """The Plan for the CLI's request: a named recipe by name, or by (model, seq[, gpus, hardware]); a request that
    matches no named recipe is planned (:func:`lcmoe_recipes.planner.plan`) when --gpus and --hardware are given.

    Raises:
        LcmoeError: missing/unknown model, no matching named recipe, or a precision the hardware lacks.
    """
    if not model:
        raise LcmoeError("no MODEL given", f"give one of {', '.join(MODELS)} with --seq N, or --list")
    if model in NAMED_RECIPES:
        recipe = NAMED_RECIPES[model]
        if (seq, gpus, hardware) != (None, None, None):
            recipe = find_named_recipe(recipe.model, seq or recipe.seq_length, gpus or recipe.num_gpus,
                                       hardware or recipe.hardware)
    else:
        if seq is None:
            raise LcmoeError(f"--seq is required with model '{model}'", "e.g. --seq 131072 (or --list for named recipes)")
        if seq <= 0:
            raise LcmoeError(f"--seq {seq} is not a positive number of tokens", "e.g. --seq 131072")
        try:
            recipe = find_named_recipe(model, seq, gpus, hardware)
        except UnknownName as exc:
            if gpus is None or hardware is None or "no named recipe" not in exc.message:
                raise LcmoeError(exc.message, exc.fix.replace("planning other model / length / GPU combinations is "
                                 "not available yet", "or give --gpus and --hardware to plan one")) from None
            from .planner import plan as search

            return search(request_from_args(model, seq, wishes)).best.plan
    plan = recipe_plan(recipe.name)
    if precision and precision != plan.precision:
        from .checks import check_plan, raise_for_errors

        changed = plan.with_changes(precision=precision)
        plan = changed.with_changes(reasons={**carry_reasons(plan, changed), "precision": Reason(
            f"{precision}, chosen with --precision", "your --precision")})
        raise_for_errors(check_plan(plan), f"recipe {recipe.name} with precision {precision}")
    return plan


def _local_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install counts as no GPU
        return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    parser = _parser()
    args = parser.parse_intermixed_args(argv)
    if args.list:
        print(list_recipes())
        return 0
    try:
        plan = resolve_plan(args.model, args.seq, args.gpus, args.hardware, args.precision, args)
        hw = plan.hardware_spec
        if args.output:
            output = Path(args.output)
        elif args.overrides:  # never overwrite the plain recipe's file with an overridden one
            digest = hashlib.sha1("\0".join(args.overrides).encode()).hexdigest()[:8]
            output = Path(f"out/{plan.name}+{digest}.yaml")
        else:
            output = Path(f"out/{plan.name}.yaml")
        if output.exists() and output.is_dir():
            raise LcmoeError(f"--output {output} is a directory", f"give a file name, e.g. {output / (plan.name + '.yaml')}")
        command = torchrun_command(output, plan.layout.world, hw.gpus_per_node)

        from . import emit  # heavy part starts here

        cfg = emit.build_config(plan, validate=not args.overrides)
        shown = plan
        if args.overrides:
            emit.apply_overrides(cfg, args.overrides)
            shown = emit.plan_from_config(cfg, hw, plan.layout.world, plan.name)
            shown = shown.with_changes(reasons=carry_reasons(plan, shown))
        warnings = emit.validate_config(cfg, hw, plan.layout.world, plan.name)
        meta = {"recipe": plan.name, "world_size": plan.layout.world, "hardware": hw.key,
                "overrides": list(args.overrides)}
        emit.write_yaml(cfg, output, meta)
    except LcmoeError as exc:
        exc.report()
        for finding in getattr(exc, "findings", [])[1:]:
            if finding.severity == "error":
                print(f"  also: {finding}", file=sys.stderr)
        return exc.exit_code

    if args.json:
        import json

        from .explain import explain_json

        print(json.dumps({**explain_json(shown, warnings), "valid": True, "yaml": str(output), "command": command,
                          "overrides": list(args.overrides)}, indent=2, default=str))
    else:
        from .report import format_plan

        print(f"{plan.name}: valid for {plan.layout.world} x {hw.key} (our checks + memory model + "
              "megatron-bridge validate())")
        print(format_plan(shown.with_changes(reasons={}) if args.explain else shown, warnings, args.overrides))
        if args.explain:
            from .explain import explain_text

            print("\n" + explain_text(shown, warnings))
        print(f"\nConfigContainer YAML: {output}")
        print(f"cluster command (on each of the {plan.layout.world // hw.gpus_per_node} nodes):\n  {command}")
    if args.plot:
        from .plots import write_plots

        try:
            written = write_plots([shown], args.plot)
        except LcmoeError as exc:
            return exc.report()
        print("plots: " + ", ".join(str(p) for p in written), file=sys.stderr if args.json else sys.stdout)
    if args.dry_run:
        return 0
    have = _local_gpus()
    if have < plan.layout.world:
        print(f"\nnot launching: this machine has {have} GPU(s), the recipe needs {plan.layout.world} "
              f"{hw.display} GPUs. Run the command above on the cluster (or use --dry-run).", file=sys.stderr)
        return 1
    import subprocess

    single_node = torchrun_command(output, plan.layout.world, plan.layout.world).replace(
        '--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:${MASTER_PORT:-29500}" ', "--standalone ")
    return subprocess.call(shlex.split(single_node))


if __name__ == "__main__":
    sys.exit(main())
