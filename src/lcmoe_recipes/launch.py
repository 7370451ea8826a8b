"""The main job: ``python -m lcmoe_recipes.launch MODEL --seq N [...] [Hydra overrides...]``.

Picks the named recipe for (MODEL, seq_length[, GPUs, hardware]) or plans one, builds its megatron-bridge
ConfigContainer, applies Hydra overrides with megatron-bridge's override utilities, checks the result again for the
target (our checks + upstream validation), prints a summary, writes the ConfigContainer YAML, and runs it:
``--executor local`` (torchrun on this node) or ``--executor slurm`` (a Slurm job through NeMo-Run); ``--dry-run``
prints the torchrun command or the sbatch script instead. From Python: :func:`submit`.

Exit codes: 0 done; 2 bad input (nothing written); 1 valid config but it cannot run here (too few GPUs) or the
launch failed (sbatch refused it, the job failed): the YAML is written, the message says why.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shlex
import sys
from pathlib import Path

from .catalog import HARDWARE, MODELS, get_hardware
from .errors import LcmoeError, UnknownName
from .executors import (EXECUTORS, LaunchResult, SlurmSettings, check_settings, nodes_for, run_local, run_slurm,
                        train_arguments)
from .plan import PRECISIONS, Plan, Reason, carry_reasons
from .plan.cli import request_arguments, request_from_args
from .recipes import NAMED_RECIPES, find_named_recipe, recipe_plan
from .train import rank_arguments

EPILOG = """\
examples:
  python -m lcmoe_recipes.launch qwen3_235b --seq 131072 --dry-run
  python -m lcmoe_recipes.launch dsv3 --seq 262144 --gpus 512 --hardware h100 --dry-run --output dsv3_256k.yaml
  python -m lcmoe_recipes.launch qwen3_235b --seq 131072 model.tensor_model_parallel_size=8 --dry-run
  python -m lcmoe_recipes.launch qwen3_next --seq 65536 train.global_batch_size=128 '+env_vars.NCCL_DEBUG=INFO' --dry-run
  python -m lcmoe_recipes.launch qwen3_235b --seq 65536 --gpus 64 --hardware gb200 --dry-run   (planned)
  python -m lcmoe_recipes.launch --list
  python -m lcmoe_recipes.launch qwen3_next --seq 8192 --executor local --smoke      (CPU-only 2-rank check)
  python -m lcmoe_recipes.launch dsv3 --seq 131072 --executor slurm --account ACCT --dry-run   (the sbatch script)
  python -m lcmoe_recipes.launch dsv3 --seq 131072 --executor slurm --account ACCT --partition batch --container-image nvcr.io/nvidia/nemo:25.11

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
    run = parser.add_argument_group("running (--executor local: torchrun on this node; slurm: NeMo-Run SlurmExecutor; "
                                    "GPUs per node from the hardware: 8 HGX, 4 GB200/GB300)")
    run.add_argument("--executor", choices=EXECUTORS, default="local", help="where to run (default: local)")
    rank_arguments(run)
    run.add_argument("--smoke-ranks", type=int, default=2, metavar="N", help="ranks of a --smoke run (default 2; "
                     "with --executor slurm the smoke job asks for 1 node and no GPUs)")
    run.add_argument("--nproc-per-node", type=int, metavar="N", help="local: ranks on this node (default: the "
                     "planned world size; a local run is one node)")
    run.add_argument("--no-wait", action="store_true", help="slurm: return once the job is submitted")
    slurm = parser.add_argument_group("slurm executor")
    slurm.add_argument("--account", help="Slurm account (default $SBATCH_ACCOUNT)")
    slurm.add_argument("--partition", help="Slurm partition (default: the cluster's)")
    slurm.add_argument("--time", default="04:00:00", help="wall-clock limit: MM, HH:MM:SS or D-HH:MM:SS "
                       "(default 04:00:00)")
    slurm.add_argument("--qos", help="Slurm QOS")
    slurm.add_argument("--container-image", metavar="IMAGE", help="Pyxis/enroot image with megatron-bridge 0.6.2; "
                       "default: run this virtualenv on the nodes (shared filesystem)")
    slurm.add_argument("--container-mounts", metavar="SRC:DST[,...]", help="container mounts, comma-separated")
    slurm.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment variable "
                       "for the job (repeatable; wins over the recipe's env_vars)")
    slurm.add_argument("--sbatch", action="append", default=[], metavar="FLAG=VALUE", help="extra #SBATCH flag, "
                       "e.g. --sbatch reservation=r1 (repeatable)")
    slurm.add_argument("--no-segment", action="store_true", help="NVL72: do not ask for --segment (Slurm older than "
                       "24.05 lacks it)")
    slurm.add_argument("--tunnel", choices=("local", "ssh"), default="local", help="local: sbatch on this machine; "
                       "ssh: submit on --host as --user")
    slurm.add_argument("--host", help="ssh tunnel: login node")
    slurm.add_argument("--user", help="ssh tunnel: user name")
    slurm.add_argument("--identity", metavar="KEYFILE", help="ssh tunnel: private key")
    slurm.add_argument("--job-dir", metavar="DIR", help="NeMo-Run experiment folder (on the cluster for ssh; "
                       "default $NEMORUN_HOME/experiments)")
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
    nodes = nodes_for(world_size, gpus_per_node)
    return (f"torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} --rdzv-backend c10d "
            f"--rdzv-endpoint \"$MASTER_ADDR:${{MASTER_PORT:-29500}}\" -m lcmoe_recipes.train "
            f"--config {shlex.quote(str(yaml_path))}")


def resolve_plan(model: str | None, seq: int | None, gpus: int | None, hardware: str | None,
                 precision: str | None = None, wishes=None) -> Plan:
    """The Plan for the CLI's request: a named recipe by name, or by (model, seq[, gpus, hardware]); a request that
    matches no named recipe is planned (:func:`lcmoe_recipes.search.plan`) when --gpus and --hardware are given.

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
            from .search import plan as search

            return search(request_from_args(model, seq, wishes)).best.plan
    plan = recipe_plan(recipe.name)
    if precision and precision != plan.precision:
        from .checks import check_plan, raise_for_errors

        changed = plan.with_changes(precision=precision)
        plan = changed.with_changes(reasons={**carry_reasons(plan, changed), "precision": Reason(
            f"{precision}, chosen with --precision", "your --precision")})
        raise_for_errors(check_plan(plan), f"recipe {recipe.name} with precision {precision}")
    return plan


def _target(found: dict, world_size: int | None, hardware: str | None, where: str) -> dict:
    meta = dict(found)
    for key, given in (("world_size", world_size), ("hardware", hardware)):
        if given is None:
            continue
        if meta.get(key) not in (None, given):
            raise LcmoeError(f"{where} was planned for {key}={meta[key]}, not {given}",
                             "plan it again for that target: python -m lcmoe_recipes.launch MODEL --seq N --gpus N "
                             "--hardware H --dry-run")
        meta[key] = given
    missing = [key for key in ("world_size", "hardware") if not meta.get(key)]
    if missing:
        raise LcmoeError(f"{where} does not say which cluster it is for ({' and '.join(missing)} unknown)",
                         "pass world_size= and hardware=, or build it with lcmoe_recipes (a factory, build_recipe, "
                         "or launch --dry-run)")
    meta.setdefault("recipe", "config")
    return meta


def _materialize(cfg, meta: dict, output: str | Path | None):
    """(YAML path, env_vars) for ``cfg`` after validating it for its target ``meta``; writes the YAML when ``cfg`` is
    a ConfigContainer or a YAML without our header."""
    from . import emit

    if isinstance(cfg, (str, os.PathLike)):
        path = Path(cfg)
        loaded, found = emit.read_yaml(path)
        emit.validate_config(loaded, meta["hardware"], meta["world_size"], meta["recipe"])
        if found.get("world_size") and found.get("hardware") and output is None:
            return path, dict(loaded.env_vars or {})
        target = Path(output or f"out/{path.stem}.{meta['hardware']}x{meta['world_size']}.yaml")
        return emit.write_yaml(loaded, target, meta), dict(loaded.env_vars or {})
    emit.validate_config(cfg, meta["hardware"], meta["world_size"], meta["recipe"])
    if output is None:
        staged = emit.write_yaml(cfg, Path("out") / f".{meta['recipe']}.staged.yaml", meta)
        digest = hashlib.sha1(staged.read_bytes()).hexdigest()[:8]
        target = staged.with_name(f"{meta['recipe']}-{digest}.yaml")
        os.replace(staged, target)
    else:
        target = emit.write_yaml(cfg, output, meta)
    return target, dict(cfg.env_vars or {})


def submit(cfg, executor="local", *, smoke: bool = False, dry_run: bool = False, wait: bool = True,
           world_size: int | None = None, hardware: str | None = None, output: str | Path | None = None,
           nproc_per_node: int | None = None, smoke_ranks: int = 2, data_path: list[str] | None = None,
           tokenizer: str | None = None, replan: bool = False) -> LaunchResult:
    """Validate ``cfg`` for its target and run it with torchrun here or as a Slurm job through NeMo-Run.

    Args:
        cfg: a ConfigContainer from lcmoe_recipes (a factory such as ``dsv3_128k_h100()``, ``build_recipe``: it
            remembers its target; a ``copy.deepcopy`` of it does not), any other ConfigContainer (then give
            ``world_size`` and ``hardware``), or the path of a YAML written by ``launch``.
        executor: ``"local"``, ``"slurm"`` (settings from the environment: ``SBATCH_ACCOUNT``), a
            :class:`~lcmoe_recipes.executors.SlurmSettings`, or a ready ``nemo_run.SlurmExecutor``.
        smoke: CPU-only check with ``smoke_ranks`` ranks (gloo all-reduce, no training; no GPU needed).
        dry_run: build the torchrun command / sbatch script and return it without running anything.
        wait: Slurm: wait for the job and read its state and logs.
        output: where to write the YAML (default for a ConfigContainer: ``out/<recipe>-<first 8 hex of the YAML's
            SHA-1>.yaml``, so two different configs never share a file; for a YAML with our header: that file).
        nproc_per_node: local: ranks (default the planned world size).
        data_path, tokenizer: real data for the ranks (see :func:`lcmoe_recipes.emit.data_overrides`).
        replan: let the ranks plan again when they find another world size or GPU type.

    Returns:
        :class:`~lcmoe_recipes.executors.LaunchResult`: state, job id, log path, first error line, the command or
        sbatch script.

    Raises:
        LcmoeError: the config fails validation for its target, its target is unknown, an unknown executor, a GPU
            count that does not fill whole nodes, missing Slurm account.
        LaunchError: too few GPUs here for a local run, or sbatch refused the job. (A job that runs and fails is
            not raised: ``result.ok`` is False and ``result.first_error`` says why.)
    """
    from . import emit

    if isinstance(executor, str) and executor not in EXECUTORS:
        raise LcmoeError(f"unknown executor '{executor}'", f"use one of {', '.join(EXECUTORS)}")
    # Everything that can be refused without building is refused before the YAML is written.
    emit.data_overrides(data_path, tokenizer)  # bad --data-path input fails here, not on the cluster
    settings = executor if isinstance(executor, SlurmSettings) else SlurmSettings() if executor == "slurm" else None
    if settings is not None:
        check_settings(settings)
    if isinstance(cfg, (str, os.PathLike)):
        meta = _target(emit.read_meta(cfg), world_size, hardware, f"'{cfg}'")
    else:
        meta = _target(emit.target_of(cfg), world_size, hardware, "this ConfigContainer")
    nodes_for(meta["world_size"], get_hardware(meta["hardware"]).gpus_per_node)
    yaml, env_vars = _materialize(cfg, meta, output)
    args = train_arguments(smoke=smoke, replan=replan, data_path=data_path, tokenizer=tokenizer)
    if executor == "local":
        return run_local(yaml, meta, env_vars, smoke=smoke, smoke_ranks=smoke_ranks, nproc_per_node=nproc_per_node,
                         dry_run=dry_run, train_args=args)
    return run_slurm(yaml, meta, env_vars, settings, smoke=smoke, smoke_ranks=smoke_ranks, dry_run=dry_run, wait=wait,
                     train_args=args, executor=None if settings is not None else executor)


def _settings_from_args(args) -> SlurmSettings:
    def pairs(items: list[str], flag: str) -> dict[str, str]:
        out = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise LcmoeError(f"{flag} {item!r} is not KEY=VALUE", f"e.g. {flag} NCCL_DEBUG=INFO")
            out[key] = value
        return out

    mounts = tuple(m for m in (args.container_mounts or "").split(",") if m)
    return SlurmSettings(account=args.account, partition=args.partition, time=args.time, qos=args.qos,
                         container_image=args.container_image, container_mounts=mounts,
                         env=pairs(args.env, "--env"), tunnel=args.tunnel,
                         host=args.host, user=args.user, identity=args.identity, job_dir=args.job_dir,
                         sbatch=pairs(args.sbatch, "--sbatch"), segment=not args.no_segment)

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
        settings = _settings_from_args(args) if args.executor == "slurm" else None
        if settings is not None:
            check_settings(settings)  # before the 15-40 s build, and before anything is written
        from . import emit  # heavy part starts here

        overrides = list(args.overrides) + emit.data_overrides(args.data_path, args.tokenizer)
        if args.output:
            output = Path(args.output)
        elif overrides:  # never overwrite the plain recipe's file with an overridden one
            digest = hashlib.sha1("\0".join(overrides).encode()).hexdigest()[:8]
            output = Path(f"out/{plan.name}+{digest}.yaml")
        else:
            output = Path(f"out/{plan.name}.yaml")
        if output.exists() and output.is_dir():
            raise LcmoeError(f"--output {output} is a directory", f"give a file name, e.g. {output / (plan.name + '.yaml')}")
        command = torchrun_command(output, plan.layout.world, hw.gpus_per_node)

        cfg = emit.build_config(plan, validate=not overrides)
        shown = plan
        if overrides:
            emit.apply_overrides(cfg, overrides)
            shown = emit.plan_from_config(cfg, hw, plan.layout.world, plan.name)
            shown = shown.with_changes(reasons=carry_reasons(plan, shown))
        warnings = emit.validate_config(cfg, hw, plan.layout.world, plan.name)
        meta = emit.target_meta(shown, overrides)
        emit.write_yaml(cfg, output, meta)
    except LcmoeError as exc:
        exc.report()
        for finding in getattr(exc, "findings", [])[1:]:
            if finding.severity == "error":
                print(f"  also: {finding}", file=sys.stderr)
        return exc.exit_code

    if not args.json:
        from .report import format_plan

        print(f"{plan.name}: valid for {plan.layout.world} x {hw.key} (our checks + memory model + "
              "megatron-bridge validate())")
        print(format_plan(shown.with_changes(reasons={}) if args.explain else shown, warnings, overrides))
        if args.explain:
            from .explain import explain_text

            print("\n" + explain_text(shown, warnings))
        print(f"\nConfigContainer YAML: {output}")
        if args.executor == "local" and not args.smoke:  # for slurm, the sbatch script is the command
            print(f"cluster command (on each of the {plan.layout.world // hw.gpus_per_node} nodes):\n  {command}")
    if args.plot:
        from .plan.cli import write_plot_files

        try:
            written = write_plot_files([shown], args.plot)
        except LcmoeError as exc:
            return exc.report()
        print("plots: " + ", ".join(str(p) for p in written), file=sys.stderr if args.json else sys.stdout)

    result = None
    if not (args.dry_run and args.executor == "local" and not args.smoke):
        train_args = train_arguments(smoke=args.smoke, replan=args.replan)  # data is in the YAML already
        try:
            if args.executor == "local":
                result = run_local(output, meta, dict(cfg.env_vars or {}), smoke=args.smoke,
                                   smoke_ranks=args.smoke_ranks, nproc_per_node=args.nproc_per_node,
                                   dry_run=args.dry_run, train_args=train_args, echo=not args.json)
            else:
                result = run_slurm(output, meta, dict(cfg.env_vars or {}), settings, smoke=args.smoke,
                                   smoke_ranks=args.smoke_ranks, dry_run=args.dry_run, wait=not args.no_wait,
                                   train_args=train_args)
        except LcmoeError as exc:
            exc.report()
            if args.json:
                print(json.dumps({"valid": True, "yaml": str(output), "launch": {"error": exc.message,
                                  "fix": exc.fix}}, indent=2))
            return exc.exit_code
    if args.json:
        from .explain import explain_json

        doc = {**explain_json(shown, warnings), "valid": True, "yaml": str(output), "command": command,
               "overrides": overrides}
        if result is not None:
            doc["launch"] = dataclasses.asdict(result)
        print(json.dumps(doc, indent=2, default=str))
    elif result is not None:
        if result.script:
            print(f"\nsbatch script ({result.command} $SBATCH_SCRIPT):\n{result.script}")
        elif result.state == "DRY_RUN":
            print(f"\nlocal command:\n  {result.command}")
        print("\n" + result.summary())
    return 0 if result is None or result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
