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
from .checks.known_issues import stack_versions
from .errors import LcmoeError, UnknownName, argument_parser
from .executors import (EXECUTORS, LaunchResult, SlurmSettings, check_settings, job_dir_of, nodes_for, run_local,
                        run_slurm, train_arguments)
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
    parser = argument_parser(
        prog="python -m lcmoe_recipes.launch",
        description="Build, validate and launch a long-context MoE training config (megatron-bridge ConfigContainer).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help=f"model ({', '.join(MODELS)}; aliases such as deepseek_v3 work), "
                                                 "a named recipe (see --list), or the path of a config.json "
                                                 "(also --model-config PATH)")
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
    request_arguments(parser.add_argument_group("planning and run options (layout flags on a named recipe plan its "
                                                "target instead)"), wishes_only=True)
    ext = parser.add_argument_group("context extension (where the weights come from, phases, your own config)")
    source = ext.add_mutually_exclusive_group()
    source.add_argument("--from-hf", metavar="DIR", help="start from the weights of a local Hugging Face checkpoint "
                        "folder (config.json must be the planned model's); megatron-bridge reads it at the first start")
    source.add_argument("--from-checkpoint", metavar="DIR", help="start from the weights of a Megatron checkpoint (a "
                        "previous phase); its saved run config must be the planned model's")
    ext.add_argument("--convert-to", metavar="DIR", help="with --from-hf: convert the folder once into a Megatron "
                     "checkpoint here at the job's start (megatron-bridge's AutoBridge; reused when complete) and "
                     "start from that")
    ext.add_argument("--phases", metavar="S1,S2,...", help="one config per phase, e.g. 32768,131072 (DeepSeek-V3's "
                     "4K->32K->128K); each phase starts from the previous phase's checkpoints and is planned for its "
                     "own length")
    ext.add_argument("--from", dest="from_config", metavar="CONFIG.yaml", help="retarget your own ConfigContainer YAML, "
                     "or one of megatron-bridge's recipes by function name (e.g. the 4K "
                     "deepseek_v3_pretrain_1024gpu_h100_fp8sc_config), to --seq N: layout, CP, batch, recompute, "
                     "offload, CUDA graphs and positions re-planned, everything else kept; prints every field that "
                     "changed and why")
    run = parser.add_argument_group("running (--executor local: torchrun on this node; slurm: NeMo-Run SlurmExecutor; "
                                    "GPUs per node from the hardware: 8 HGX, 4 GB200/GB300)")
    run.add_argument("--executor", choices=EXECUTORS, default="local", help="where to run (default: local)")
    rank_arguments(run)
    run.add_argument("--smoke-ranks", type=int, default=2, metavar="N", help="ranks of a --smoke run (default 2; "
                     "with --executor slurm the smoke job asks for 1 node and no GPUs)")
    run.add_argument("--smoke-nodes", type=int, default=1, metavar="N", help="slurm: nodes of a --smoke job (default "
                     "1); every node checks that the data, tokenizer and checkpoint paths exist there")
    run.add_argument("--nproc-per-node", type=int, metavar="N", help="local: ranks on this node (default: the "
                     "planned world size; a local run is one node)")
    run.add_argument("--no-wait", action="store_true", help="slurm: return once the job is submitted")
    slurm = parser.add_argument_group("slurm executor")
    slurm.add_argument("--account", help="Slurm account (default $SBATCH_ACCOUNT; none: no account line)")
    slurm.add_argument("--partition", help="Slurm partition (default: the cluster's)")
    slurm.add_argument("--time", default="04:00:00", help="wall-clock limit with its hours: HH:MM:SS or D-HH:MM:SS "
                       "(default 04:00:00); training stops 20 min before it and saves a checkpoint "
                       "(train.exit_duration_in_mins)")
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
    slurm.add_argument("--job-dir", metavar="DIR", help="NeMo-Run experiment folder, on a filesystem every node "
                       "sees (on the cluster for ssh; default $NEMORUN_HOME/experiments)")
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


# Flags that ask for another layout or other knobs than a named recipe pins: with them, the recipe's target is planned.
LAYOUT_WISHES = ("tp", "pp", "cp", "ep", "dispatcher", "no_offload", "variable_length")


def _layout_wishes(wishes) -> list[str]:
    given = [name for name in LAYOUT_WISHES if getattr(wishes, name, None)]
    if getattr(wishes, "mbs", 1) not in (1, None):
        given.append("mbs")
    return given


def run_options(wishes) -> dict:
    """The per-run options (:class:`lcmoe_recipes.rules.extension.RunOptions`) the CLI's flags ask for."""
    if wishes is None:
        return {}
    values = {"rope": getattr(wishes, "rope", "auto"), "tokens_per_step": getattr(wishes, "tokens_per_step", None),
              "global_batch_size": getattr(wishes, "gbs", None), "lr": getattr(wishes, "lr", None),
              "train_iters": getattr(wishes, "train_iters", None),
              "pretrained_checkpoint": getattr(wishes, "pretrained_checkpoint", None)}
    return {k: v for k, v in values.items() if v is not None and not (k == "rope" and v == "auto")}


def resolve_plan(model: str | None, seq: int | None, gpus: int | None, hardware: str | None,
                 precision: str | None = None, wishes=None) -> Plan:
    """The Plan for the CLI's request: a named recipe by name, or by (model, seq[, gpus, hardware]); a request that
    matches no named recipe is planned (:func:`lcmoe_recipes.search.plan`) when --gpus and --hardware are given, and
    so is a named recipe's target when layout wishes (--tp/--pp/--cp/--ep/--dispatcher/--mbs/--no-offload/
    --variable-length) ask for something the recipe pins.

    Raises:
        LcmoeError: missing/unknown model, a non-positive --seq/--gpus, no matching named recipe, or a precision the
            hardware lacks.
    """
    model = model or getattr(wishes, "model_config", None)
    if not model:
        raise LcmoeError("no MODEL given", f"give one of {', '.join(MODELS)} with --seq N, --model-config PATH, "
                         "or --list")
    for flag, value, example in (("--seq", seq, "--seq 131072"), ("--gpus", gpus, "--gpus 256")):
        if value is not None and value <= 0:
            raise LcmoeError(f"{flag} {value} is not a positive number", f"e.g. {example}")
    if model in NAMED_RECIPES:
        recipe = NAMED_RECIPES[model]
        if (seq, gpus, hardware) != (None, None, None):
            recipe = find_named_recipe(recipe.model, seq or recipe.seq_length, gpus or recipe.num_gpus,
                                       hardware or recipe.hardware)
    else:
        if seq is None:
            raise LcmoeError(f"--seq is required with model '{model}'", "e.g. --seq 131072 (or --list for named recipes)")
        try:
            recipe = find_named_recipe(model, seq, gpus, hardware)
        except UnknownName as exc:
            if gpus is None or hardware is None or "no named recipe" not in exc.message:
                raise LcmoeError(exc.message, exc.fix.replace("planning other model / length / GPU combinations is "
                                 "not available yet", "or give --gpus and --hardware to plan one")) from None
            from .search import plan as search

            return search(request_from_args(model, seq, wishes)).best.plan
    asked = _layout_wishes(wishes)
    if asked:  # the recipe pins what these flags change: plan its target with them instead
        from .search import plan as search

        target = argparse.Namespace(**{**vars(wishes), "gpus": recipe.num_gpus, "hardware": recipe.hardware})
        best = search(request_from_args(recipe.model, recipe.seq_length, target)).best.plan
        flags = ", ".join("--" + a.replace("_", "-") for a in asked)
        note = (f"planned for the named recipe's target ({recipe.num_gpus} x {recipe.hardware}) because {flags} "
                f"ask(s) for what {recipe.name} pins; ")
        return best.with_changes(reasons={**best.reasons, "layout": Reason(note + best.reasons["layout"].why,
                                                                           best.reasons["layout"].source)})
    options = run_options(wishes)
    if precision and "precision" in recipe.options:
        options["precision"] = precision
    plan = recipe_plan(recipe.name, **options)
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
    from .emit.stack import installed_stack

    for key, version in installed_stack().items():  # validated here, with these versions
        meta.setdefault(key, version)
    return meta


def _materialize(cfg, meta: dict, output: str | Path | None, extra: list[str] = (), check_job=None, versions=None):
    """(YAML path, env_vars, what ``check_job`` returned) for ``cfg``: validated for its target ``meta`` with the
    ranks' ``extra`` overrides applied (to a copy; they travel on the ranks' command line; known upstream bugs judged
    for ``versions``, default the installed ones), then ``check_job(that config)``, and only then the YAML written
    (when ``cfg`` is a ConfigContainer or a YAML without our header)."""
    import copy

    from . import emit

    path = Path(cfg) if isinstance(cfg, (str, os.PathLike)) else None
    loaded, found = emit.read_yaml(path) if path else (cfg, {})
    effective = emit.apply_overrides(copy.deepcopy(loaded), list(extra)) if extra else loaded
    emit.validate_config(effective, meta["hardware"], meta["world_size"], meta["recipe"], versions)
    job = check_job(effective) if check_job else None
    env_vars = dict(loaded.env_vars or {})
    if path:
        if found.get("world_size") and found.get("hardware") and output is None:
            return path, env_vars, job
        target = Path(output or f"out/{path.stem}.{meta['hardware']}x{meta['world_size']}.yaml")
        return emit.write_yaml(loaded, target, meta), env_vars, job
    if output is None:
        staged = emit.write_yaml(cfg, Path("out") / f".{meta['recipe']}.staged.yaml", meta)
        digest = hashlib.sha1(staged.read_bytes()).hexdigest()[:8]
        target = staged.with_name(f"{meta['recipe']}-{digest}.yaml")
        os.replace(staged, target)
    else:
        target = emit.write_yaml(cfg, output, meta)
    return target, env_vars, job


def _settings_of(executor) -> SlurmSettings:
    """The settings a ready ``nemo_run.SlurmExecutor`` stands for (time, container, mounts, tunnel, job folder), for
    the same checks as ours."""
    import nemo_run as run

    tunnel = executor.tunnel
    return SlurmSettings(account=executor.account, time=executor.time, container_image=executor.container_image,
                         container_mounts=tuple(executor.container_mounts or ()),
                         tunnel="local" if tunnel is None or isinstance(tunnel, run.LocalTunnel) else "ssh",
                         host=getattr(tunnel, "host", None), user=getattr(tunnel, "user", None),
                         job_dir=tunnel.job_dir if tunnel is not None else executor.job_dir)


def slurm_job_check(settings: SlurmSettings, meta: dict, smoke: bool = False, smoke_nodes: int = 1):
    """Check the job folder for ``settings`` and the nodes ``meta`` plans for (``smoke_nodes`` for a smoke job) now
    (:func:`lcmoe_recipes.job_checks.job_folder_findings`: no config needed), and return the check of the ranks'
    ConfigContainer (:func:`lcmoe_recipes.job_checks.slurm_job`, the folder's warnings added).

    Raises:
        InfeasibleConfig: a node-local job folder for a multi-node job.
    """
    from .checks import raise_for_errors
    from .job_checks import job_folder_findings, slurm_job

    nodes = smoke_nodes if smoke else nodes_for(meta["world_size"], get_hardware(meta["hardware"]).gpus_per_node)
    job_dir = job_dir_of(settings)
    folder = job_folder_findings(job_dir, nodes, settings.tunnel == "local")
    raise_for_errors(folder, "the Slurm job")

    def check(cfg):
        job = slurm_job(cfg, settings, job_dir, smoke=smoke)
        job.findings = folder + job.findings
        return job

    return check


def submit(cfg, executor="local", *, smoke: bool = False, dry_run: bool = False, wait: bool = True,
           world_size: int | None = None, hardware: str | None = None, output: str | Path | None = None,
           nproc_per_node: int | None = None, smoke_ranks: int = 2, smoke_nodes: int = 1,
           data_path: list[str] | None = None,
           tokenizer: str | None = None, save_dir: str | None = None, replan: bool = False) -> LaunchResult:
    """Validate ``cfg`` for its target and run it with torchrun here or as a Slurm job through NeMo-Run.

    Args:
        cfg: a ConfigContainer from lcmoe_recipes (a factory such as ``dsv3_128k_h100()``, ``build_recipe``: it
            remembers its target; a ``copy.deepcopy`` of it does not), any other ConfigContainer (then give
            ``world_size`` and ``hardware``), or the path of a YAML written by ``launch``.
        executor: ``"local"``, ``"slurm"`` (settings from the environment: ``SBATCH_ACCOUNT``), a
            :class:`~lcmoe_recipes.executors.SlurmSettings`, or a ready ``nemo_run.SlurmExecutor``.
        smoke: CPU-only check with ``smoke_ranks`` ranks (gloo all-reduce, no training; no GPU needed); under Slurm
            on ``smoke_nodes`` nodes, each checking that the config's paths exist there.
        dry_run: build the torchrun command / sbatch script and return it without running anything.
        wait: Slurm: wait for the job and read its state and logs.
        output: where to write the YAML (default for a ConfigContainer: ``out/<recipe>-<first 8 hex of the YAML's
            SHA-1>.yaml``, so two different configs never share a file; for a YAML with our header: that file).
        nproc_per_node: local: ranks (default the planned world size).
        data_path, tokenizer: real data for the ranks (see :func:`lcmoe_recipes.emit.data_overrides`).
        save_dir: absolute folder for the run's checkpoints and logs (see :func:`lcmoe_recipes.emit.save_overrides`).
        replan: let the ranks plan again when they find another world size or GPU type.

    Returns:
        :class:`~lcmoe_recipes.executors.LaunchResult`: state, job id, log path, first error line, the command or
        sbatch script; for Slurm, ``notes`` (the exit duration from ``time``, the job folder rule, warnings about
        the job's paths).

    Raises:
        LcmoeError: the config fails validation for its target, its target is unknown, an unknown executor, a GPU
            count that does not fill whole nodes, a Slurm time without hours, a path the Slurm job cannot use
            (:func:`lcmoe_recipes.job_checks.slurm_job`).
        LaunchError: too few GPUs here for a local run, or sbatch refused the job. (A job that runs and fails is
            not raised: ``result.ok`` is False and ``result.first_error`` says why.)
    """
    from . import emit

    if isinstance(executor, str) and executor not in EXECUTORS:
        raise LcmoeError(f"unknown executor '{executor}'", f"use one of {', '.join(EXECUTORS)}")
    # Everything that can be refused without building is refused before the YAML is written.
    extra = emit.save_overrides(save_dir) + emit.data_overrides(data_path, tokenizer)  # bad input fails here
    settings = executor if isinstance(executor, SlurmSettings) else SlurmSettings() if executor == "slurm" else None
    if settings is not None:
        check_settings(settings)
    if isinstance(cfg, (str, os.PathLike)):
        meta = _target(emit.read_meta(cfg), world_size, hardware, f"'{cfg}'")
    else:
        meta = _target(emit.target_of(cfg), world_size, hardware, "this ConfigContainer")
    nodes_for(meta["world_size"], get_hardware(meta["hardware"]).gpus_per_node)
    image = settings.container_image if settings is not None else getattr(executor, "container_image", None)
    versions = stack_versions(image)[0]  # the container's versions if listed
    if executor == "local":
        yaml, env_vars, _ = _materialize(cfg, meta, output, extra, versions=versions)
        args = train_arguments(smoke=smoke, replan=replan, data_path=data_path, tokenizer=tokenizer, save_dir=save_dir)
        return run_local(yaml, meta, env_vars, smoke=smoke, smoke_ranks=smoke_ranks, nproc_per_node=nproc_per_node,
                         dry_run=dry_run, train_args=args)
    check = slurm_job_check(settings or _settings_of(executor), meta, smoke, smoke_nodes)
    yaml, env_vars, job = _materialize(cfg, meta, output, extra, check, versions)
    args = train_arguments(smoke=smoke, replan=replan, data_path=data_path, tokenizer=tokenizer, save_dir=save_dir,
                           overrides=job.overrides)
    return run_slurm(yaml, meta, env_vars, settings, smoke=smoke, smoke_ranks=smoke_ranks, smoke_nodes=smoke_nodes,
                     dry_run=dry_run, wait=wait,
                     train_args=args, executor=None if settings is not None else executor,
                     notes=job.notes + [f"{f.severity}: {f.rule}: {f.message}; fix: {f.fix}" for f in job.findings])


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

@dataclasses.dataclass
class Built:
    """One config ``main`` built: the plan asked for, the plan the config states (after overrides), the config, where
    its YAML went, its header, findings, overrides, the command each node runs, and the Slurm job checks."""

    plan: Plan
    shown: Plan
    cfg: object
    output: Path
    meta: dict
    warnings: list
    overrides: list
    command: str
    job: object = None
    changes: list = dataclasses.field(default_factory=list)


def _model_key(model: str | None) -> str:
    if not model:
        raise LcmoeError("no MODEL given", f"give one of {', '.join(MODELS)} with --seq N, or --list")
    if model in NAMED_RECIPES:
        return NAMED_RECIPES[model].model
    from .catalog import get_model

    return get_model(model).key


def weights_source(args, model_key: str) -> tuple[str | None, dict, list]:
    """(checkpoint.pretrained_checkpoint, the YAML header's ``weights`` entry, warnings) for ``--from-hf`` /
    ``--from-checkpoint`` / ``--convert-to``. A folder this machine sees is checked now against the planned model
    (:mod:`lcmoe_recipes.checkpoint_folders`); one it does not see is checked where the job starts.

    Raises:
        LcmoeError: a folder that is not the planned model, is incomplete, or ``--convert-to`` without ``--from-hf``.
    """
    from .catalog import get_model
    from .checkpoint_folders import check_hf_folder, check_megatron_checkpoint
    from .checks import Finding

    spec = get_model(model_key)
    if args.convert_to and not args.from_hf:
        raise LcmoeError("--convert-to converts a Hugging Face folder and needs --from-hf DIR",
                         "add --from-hf DIR, or drop --convert-to")
    folder = args.from_hf or args.from_checkpoint
    if not folder:
        return None, {}, []
    flag = "--from-hf" if args.from_hf else "--from-checkpoint"
    notes = []
    if Path(folder).exists():
        (check_hf_folder if args.from_hf else check_megatron_checkpoint)(folder, spec)
    else:
        notes.append(Finding("warning", "weights/not-here", f"{flag} {folder} is not on this machine: it is checked "
                             "against the planned model where the job starts", "build on a machine that sees it to "
                             "have it checked now"))
    if args.from_hf:
        entry = {"from_hf": folder, **({"convert_to": args.convert_to} if args.convert_to else {})}
        return args.convert_to or folder, entry, notes
    return folder, {"from_checkpoint": folder}, notes


def _weights_reason(entry: dict, spec_display: str) -> Reason | None:
    if "from_hf" in entry:
        how = (f"converted once into {entry['convert_to']} at the job's start (megatron-bridge AutoBridge, "
               "lcmoe_recipes.convert), then loaded" if "convert_to" in entry else
               "read by megatron-bridge at the first start (a Hugging Face folder as checkpoint.pretrained_checkpoint)")
        return Reason(f"{spec_display} weights from the Hugging Face checkpoint {entry['from_hf']}, {how}; optimizer "
                      "state fresh; later restarts resume from this run's own checkpoints",
                      "megatron-bridge 0.6.2 training/checkpointing.py (_load_hf_pretrained_checkpoint, finetune on "
                      "the first start)")
    if "from_checkpoint" in entry:
        return Reason(f"model weights from the Megatron checkpoint {entry['from_checkpoint']} (optimizer state "
                      "fresh, iteration reset)", "megatron-bridge 0.6.2 training/checkpointing.py (pretrained "
                      "checkpoint loaded with finetune=True when checkpoint.load holds none)")
    return None


def _phase_lengths(args) -> list[int]:
    if not args.phases:
        return [args.seq] if args.seq is not None else [None]
    if args.seq is not None:
        raise LcmoeError("give --seq N or --phases S1,S2,..., not both", "e.g. --phases 32768,131072")
    try:
        lengths = [int(x) for x in args.phases.split(",") if x.strip()]
    except ValueError:
        raise LcmoeError(f"--phases {args.phases!r} is not a comma-separated list of token counts",
                         "e.g. --phases 32768,131072") from None
    if not lengths or any(n <= 0 for n in lengths) or lengths != sorted(set(lengths)):
        raise LcmoeError(f"--phases {args.phases}: give increasing positive lengths", "e.g. --phases 32768,131072")
    return lengths


def _phase_target(args, model_key: str, lengths: list[int]) -> tuple[int | None, str | None]:
    """--gpus/--hardware for every phase: as given, else the named recipe's that covers one of the lengths."""
    if args.gpus and args.hardware or len(lengths) == 1:
        return args.gpus, args.hardware
    for length in reversed(lengths):
        try:
            recipe = find_named_recipe(model_key, length, args.gpus, args.hardware)
        except UnknownName:
            continue
        return recipe.num_gpus, recipe.hardware
    raise LcmoeError(f"--phases {args.phases}: no named recipe gives the target of these phases",
                     "give --gpus N and --hardware NAME (every phase runs on them)")


def _build(plan: Plan, args, overrides: list[str], output: Path | None, versions, version_notes, weights: dict,
           check_job) -> Built:
    """Build, override, validate and write one config (the heavy part)."""
    from . import emit

    hw = plan.hardware_spec
    if output is None:
        if overrides:  # never overwrite the plain recipe's file with an overridden one
            digest = hashlib.sha1("\0".join(overrides).encode()).hexdigest()[:8]
            output = Path(f"out/{plan.name}+{digest}.yaml")
        else:
            output = Path(f"out/{plan.name}.yaml")
    if output.exists() and output.is_dir():
        raise LcmoeError(f"--output {output} is a directory", f"give a file name, e.g. {output / (plan.name + '.yaml')}")
    cfg = emit.build_config(plan, validate=not overrides)
    shown = plan
    if overrides:
        emit.apply_overrides(cfg, overrides)
        shown = emit.plan_from_config(cfg, hw, plan.layout.world, plan.name)
        shown = shown.with_changes(reasons=carry_reasons(plan, shown))
    warnings = emit.validate_config(cfg, hw, plan.layout.world, plan.name, versions) + list(version_notes)
    meta = {**emit.target_meta(shown, overrides), **({"weights": weights} if weights else {})}
    if plan.name in NAMED_RECIPES:  # what the recipe was built with, so `check` compares like with like
        options = {**run_options(args), "pretrained_checkpoint": plan.pretrained_checkpoint}
        if getattr(args, "precision", None) and "precision" in NAMED_RECIPES[plan.name].options:
            options["precision"] = args.precision
        options = {k: v for k, v in options.items() if v is not None}
        if options:
            meta["options"] = options
    job = check_job(cfg) if check_job is not None else None
    if job is not None:
        warnings = warnings + job.findings
    emit.write_yaml(cfg, output, meta)
    return Built(plan, shown, cfg, output, meta, warnings, overrides,
                 torchrun_command(output, plan.layout.world, hw.gpus_per_node), job)


def _time_findings(one: Built, settings, smoke: bool, chained: bool) -> list:
    """A Slurm training job's predicted time against its ``--time`` (:func:`lcmoe_recipes.job_checks.
    training_time_finding`): [] or one warning.

    Raises:
        InfeasibleConfig: a phase that would stop early while the next one waits on it (``afterok``).
    """
    if settings is None or smoke or not one.cfg.train.train_iters:
        return []
    from .checks import raise_for_errors
    from .cost import estimate_step
    from .job_checks import training_time_finding

    finding = training_time_finding(one.cfg.train.train_iters, estimate_step(one.shown).step_seconds, settings.time,
                                    chained)
    if finding is None:
        return []
    raise_for_errors([finding], one.plan.name)
    return [finding]


def _report_error(exc: LcmoeError, as_json: bool, warnings: list = ()) -> int:
    """Print an error (and the warnings found so far, and the other errors) as text on stderr, or as JSON on stdout."""
    others = [f for f in getattr(exc, "findings", [])[1:]]
    if as_json:
        print(json.dumps({"valid": False, "error": exc.message, "fix": exc.fix,
                          "findings": [dataclasses.asdict(f) for f in others + list(warnings)]}, indent=2))
        return exc.exit_code
    exc.report()
    for finding in others:
        print(f"  also: {finding}", file=sys.stderr)
    for finding in warnings:
        print(f"  warning: {finding}", file=sys.stderr)
    return exc.exit_code


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    parser = _parser()
    args = parser.parse_intermixed_args(argv)
    if args.list:
        print(list_recipes())
        return 0
    built: list[Built] = []
    try:
        for flag, value in (("--smoke-ranks", args.smoke_ranks), ("--smoke-nodes", args.smoke_nodes)):
            if value < 1:
                raise LcmoeError(f"{flag} {value} is not a positive count", f"e.g. {flag} 2")
        settings = _settings_from_args(args) if args.executor == "slurm" else None
        if settings is not None:
            check_settings(settings)  # before the 15-40 s build, and before anything is written
        # Known upstream bugs are judged for the versions the job runs: the listed container's, else the installed.
        versions, version_notes = stack_versions(args.container_image)
        if args.from_config:
            built = [_retargeted(args, versions, version_notes, settings)]
        else:
            model_key = _model_key(args.model)
            lengths = _phase_lengths(args)
            if len(lengths) > 1 and args.executor == "slurm" and not args.save_dir:
                raise LcmoeError("--phases on Slurm needs --save-dir: each job runs in its own code folder, so the next "
                                 "phase would not find the previous phase's checkpoints",
                                 "add --save-dir /shared/folder (each phase saves under DIR/phaseN_<len>k)")
            gpus, hardware = _phase_target(args, model_key, lengths)
            pretrained, weights, notes = weights_source(args, model_key)
            for index, length in enumerate(lengths):
                phased = len(lengths) > 1
                wishes = argparse.Namespace(**{**vars(args), "gpus": gpus, "hardware": hardware,
                                               "pretrained_checkpoint": pretrained})
                plan = resolve_plan(args.model if not phased or args.model not in NAMED_RECIPES else model_key,
                                    length, gpus, hardware, args.precision, wishes)
                why = _weights_reason(weights, plan.model_spec.display) if index == 0 else Reason(
                    f"model weights from phase {index}'s checkpoints ({pretrained}); optimizer state fresh, "
                    "iteration reset", "megatron-bridge 0.6.2 training/checkpointing.py (pretrained checkpoint "
                    "loaded with finetune=True)")
                if why is not None:
                    plan = plan.with_changes(reasons={**plan.reasons, "pretrained_checkpoint": why})
                if phased:
                    plan = plan.with_changes(name=f"{plan.name}-phase{index + 1}")
                save_dir = (f"{args.save_dir.rstrip('/')}/phase{index + 1}_{length // 1024}k"
                            if args.save_dir and phased else args.save_dir)
                check_job = None
                if settings is not None:  # the job folder, before the build
                    check_job = slurm_job_check(settings, {"world_size": plan.layout.world,
                                                           "hardware": plan.hardware_spec.key},
                                                args.smoke, args.smoke_nodes)
                from . import emit  # heavy part starts here

                overrides = (emit.save_overrides(save_dir) + list(args.overrides)
                             + emit.data_overrides(args.data_path, args.tokenizer))
                output = Path(args.output) if args.output and not phased else None
                one = _build(plan, args, overrides, output, versions, version_notes,
                             (weights if index == 0 else {"from_checkpoint": pretrained}), check_job)
                one.warnings = one.warnings + (notes if index == 0 else []) + _time_findings(
                    one, settings, args.smoke, chained=index < len(lengths) - 1)
                built.append(one)
                pretrained = one.cfg.checkpoint.save
    except LcmoeError as exc:
        return _report_error(exc, args.json, [w for b in built for w in b.warnings])

    for one in built:
        _print_built(one, args)
    if args.plot:
        from .plan.cli import write_plot_files

        try:
            written = write_plot_files([b.shown for b in built], args.plot)
        except LcmoeError as exc:
            return _report_error(exc, args.json)
        print("plots: " + ", ".join(str(p) for p in written), file=sys.stderr if args.json else sys.stdout)

    results = []
    if not (args.dry_run and args.executor == "local" and not args.smoke):
        dependency = None
        for one in built:
            try:
                result = _run(one, args, settings, dependency, wait=not args.no_wait and len(built) == 1)
            except LcmoeError as exc:
                if args.json:
                    print(json.dumps({"valid": True, "yaml": str(one.output), "launch": {"error": exc.message,
                                      "fix": exc.fix}}, indent=2))
                else:
                    exc.report()
                return exc.exit_code
            results.append(result)
            if not result.ok:
                break
            dependency = result.job_id
    if args.json:
        from .explain import explain_json

        docs = []
        for index, one in enumerate(built):
            doc = {**explain_json(one.shown, one.warnings), "valid": True, "yaml": str(one.output),
                   "command": one.command, "overrides": one.overrides}
            if one.changes:
                doc["changes"] = [{"field": d.path, "before": d.upstream, "after": d.ours, "setting": d.setting,
                                   "reason": d.reason.why} for d in one.changes]
            if index < len(results):
                doc["launch"] = dataclasses.asdict(results[index])
            docs.append(doc)
        print(json.dumps(docs[0] if len(docs) == 1 else {"phases": docs}, indent=2, default=str))
    else:
        for result in results:
            if result.script:
                print(f"\nsbatch script ({result.command} $SBATCH_SCRIPT):\n{result.script}")
            elif result.state == "DRY_RUN":
                print(f"\nlocal command:\n  {result.command}")
            print("\n" + result.summary())
    return 0 if all(r.ok for r in results) else 1


def _print_built(one: Built, args) -> None:
    if args.json:
        return
    from .report import format_plan

    plan, hw = one.plan, one.plan.hardware_spec
    print(f"{plan.name}: valid for {plan.layout.world} x {hw.key} (our checks + memory model + "
          "megatron-bridge validate())")
    if one.changes:
        print(f"retargeted {one.meta.get('retargeted_from')}: {len(one.changes)} field(s) changed (each setting's "
              "reason once, below its fields)")
        by_setting: dict[str, list] = {}
        for d in one.changes:
            by_setting.setdefault(d.setting, []).append(d)
        for setting, changes in by_setting.items():
            for d in changes:
                print(f"  {d.path}: {d.upstream!r} -> {d.ours!r}")
            print(f"    [{setting}: {changes[0].reason.why}]")
    print(format_plan(one.shown.with_changes(reasons={}) if args.explain else one.shown, one.warnings, one.overrides))
    if args.explain:
        from .explain import explain_text

        print("\n" + explain_text(one.shown, one.warnings))
    print(f"\nConfigContainer YAML: {one.output}")
    if args.executor == "local" and not args.smoke:  # for slurm, the sbatch script is the command
        print(f"cluster command (on each of the {plan.layout.world // hw.gpus_per_node} nodes):\n  {one.command}")


def _run(one: Built, args, settings, after_job: str | None, wait: bool) -> LaunchResult:
    """Run one built config (the next phase waits for the previous one: sequentially here, ``afterok`` on Slurm)."""
    # data and save folders are in the YAML already; the job's exit duration goes on the ranks' command line
    train_args = train_arguments(smoke=args.smoke, replan=args.replan, overrides=one.job.overrides if one.job else ())
    if args.executor == "local":
        return run_local(one.output, one.meta, dict(one.cfg.env_vars or {}), smoke=args.smoke,
                         smoke_ranks=args.smoke_ranks, nproc_per_node=args.nproc_per_node, dry_run=args.dry_run,
                         train_args=train_args, echo=not args.json)
    if after_job:
        settings = dataclasses.replace(settings, sbatch={**settings.sbatch, "dependency": f"afterok:{after_job}"})
    return run_slurm(one.output, one.meta, dict(one.cfg.env_vars or {}), settings, smoke=args.smoke,
                     smoke_ranks=args.smoke_ranks, smoke_nodes=args.smoke_nodes, dry_run=args.dry_run,
                     wait=wait, train_args=train_args, notes=one.job.notes if one.job else [])


def _from_source(source: str):
    """(ConfigContainer, header) of ``--from``: a YAML file, else a megatron-bridge recipe by function name (built
    offline from the catalogue's config.json; its target is the one its name states).

    Raises:
        LcmoeError: neither a file nor a recorded upstream recipe (with the closest recipe names), or a bad YAML.
    """
    from . import emit
    from .catalog.upstream import find_upstream_recipe, upstream_recipes

    if Path(source).exists():
        meta = emit.read_meta(source)
        cfg, _ = emit.read_yaml(source)
        return cfg, meta
    recipe = find_upstream_recipe(source)
    if recipe is None:
        import difflib

        close = difflib.get_close_matches(source, sorted(r.name for r in upstream_recipes()), n=3, cutoff=0.5)
        raise LcmoeError(f"--from '{source}' is neither a file nor a megatron-bridge recipe this catalogue records",
                         "give a ConfigContainer YAML, or a recipe name" + (f", e.g. {', '.join(close)}" if close else
                                                                            " (see src/lcmoe_recipes/catalog/"
                                                                            "upstream_recipes.json)"))
    from .catalog import models_by_hf_id
    from .emit.upstream import upstream_config

    return upstream_config(recipe.function, models_by_hf_id()[recipe.hf_id]), {"world_size": recipe.gpus,
                                                                             "hardware": recipe.hardware}


def _retargeted(args, versions, version_notes, settings) -> Built:
    """``--from CONFIG.yaml --seq N``: the user's config re-planned for N (:mod:`lcmoe_recipes.retarget`)."""
    from . import emit
    from .retarget import retarget

    if args.seq is None:
        raise LcmoeError("--from needs --seq N (the length to retarget the config to)", "e.g. --seq 131072")
    cfg_in, meta_in = _from_source(args.from_config)
    gpus, hardware = args.gpus or meta_in.get("world_size"), args.hardware or meta_in.get("hardware")
    missing = [flag for flag, value in (("--gpus N", gpus), ("--hardware NAME", hardware)) if not value]
    if missing:
        raise LcmoeError(f"'{args.from_config}' does not record its target", f"give {' and '.join(missing)}")
    cfg, plan, changes = retarget(cfg_in, get_hardware(hardware).key, gpus, args.seq, args,
                                  name=f"{Path(args.from_config).stem}-{args.seq // 1024}k")
    overrides = emit.save_overrides(args.save_dir) + list(args.overrides) + emit.data_overrides(args.data_path,
                                                                                               args.tokenizer)
    shown = plan
    if overrides:
        emit.apply_overrides(cfg, overrides)
        shown = emit.plan_from_config(cfg, plan.hardware_spec, gpus, plan.name).with_changes(
            reasons=carry_reasons(plan, emit.plan_from_config(cfg, plan.hardware_spec, gpus, plan.name)))
    warnings = emit.validate_config(cfg, plan.hardware_spec, gpus, plan.name, versions) + list(version_notes)
    job = None
    if settings is not None:
        job = slurm_job_check(settings, {"world_size": gpus, "hardware": plan.hardware_spec.key}, args.smoke,
                              args.smoke_nodes)(cfg)
        warnings = warnings + job.findings
    output = Path(args.output or f"out/{plan.name}.yaml")
    meta = {**emit.target_meta(shown, overrides), "retargeted_from": str(args.from_config)}
    emit.write_yaml(cfg, output, meta)
    return Built(plan, shown, cfg, output, meta, warnings, overrides,
                 torchrun_command(output, gpus, plan.hardware_spec.gpus_per_node), job, changes)


if __name__ == "__main__":
    sys.exit(main())
