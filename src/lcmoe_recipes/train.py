"""Entry script run on every rank: ``python -m lcmoe_recipes.train --config FILE [options] [Hydra overrides...]``.

First, with ``$LCMOE_OVERLAY`` set (a Slurm job onto an image with other megatron versions), puts that overlay of the
pinned wheels first on the import path (:func:`lcmoe_recipes.overlay.activate`). Rebuilds the ConfigContainer from the
YAML ``launch`` wrote (or from a named recipe with ``--recipe``), applies overrides (and ``--data-path`` / ``--tokenizer`` / ``--save-dir``), refuses to start when the megatron-core /
megatron-bridge versions here differ from the ones the YAML was built with (before torch.distributed or any GPU
work), when the world size or GPU type it finds differs from what the config was planned for (``--replan`` plans
again for what it finds instead), or when a path the config reads is missing on this node; validates, and calls
megatron-bridge's ``pretrain`` with its GPT forward step. Mock data unless a dataset is given.

``--as-rank R`` runs global rank R of the full-size job alone on this machine's GPU, the other ranks answered by fake
collectives, for a few steps (``--steps``), and prints torch's peak allocated / reserved memory beside our prediction
for that rank, with a memory snapshot (:mod:`lcmoe_recipes.emit.rank_run`; docs/build.md).

``--smoke`` is the CPU-only proof used by the tests and before queueing a big job: every rank rebuilds and validates
the config for its planned target, joins torch.distributed with the gloo backend through the same rendezvous
variables the GPU run uses (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` from torchrun), checks with one
all-reduce and one all-gather that every rank is there, built the same config, and finds the data, tokenizer and
checkpoint paths on its node (rank 0 names every node that lacks one), and exits 0 without training.

Exit codes: 0 done; 2 refused (versions, world size, GPU, bad config or input, a path missing on a node); 1 the smoke
collective gave a wrong answer.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import os
import sys
import tempfile
from pathlib import Path

from .catalog import HARDWARE, get_hardware
from .emit.stack import installed_stack
from .cli.common import ArgumentParser
from .errors import LcmoeError
from .job_paths import problems_here
from .overlay import activate as activate_overlay

RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
EPILOG = """\
Run it on every rank under torchrun, which sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK (the world
size is compared with the YAML's plan; under Slurm SLURM_NTASKS is used when WORLD_SIZE is unset). Usually
`python -m lcmoe_recipes.launch ... --executor local|slurm` starts it for you; by hand:

  python -m torch.distributed.run --standalone --nproc-per-node 2 -m lcmoe_recipes.train --config out/x.yaml --smoke
  torchrun --nnodes 32 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" \\
      -m lcmoe_recipes.train --config out/dsv3_128k_h100.yaml --data-path /data/web_text_document

--smoke: every rank validates the config for its planned target, joins a gloo process group, runs one all-reduce
and one all-gather (of a digest of its config and of the paths missing on its node), and exits 0 -- no GPU needed.
--as-rank R (no torchrun): rank R of the job alone on this GPU, fake collectives, a few steps; peak memory beside
our prediction, and a memory snapshot, under --out:

  python -m lcmoe_recipes.train --config recipes/dsv3_128k_h100.yaml --as-rank 224 --steps 3 --out out/rank224

Exit codes: 0 done; 2 refused (versions, world size, GPU, config, input, paths missing on a node); 1 a smoke
collective gave a wrong answer.
"""


def detected_world_size() -> int | None:
    """World size from torchrun (``WORLD_SIZE``) or Slurm (``SLURM_NTASKS``), None when neither is set."""
    for var in ("WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def hardware_of_device(device_name: str | None) -> str | None:
    """Catalogue key of the GPU ``torch.cuda.get_device_properties(0).name`` reports (None: unknown or no GPU)."""
    if not device_name:
        return None
    return next((hw.key for hw in HARDWARE.values() if device_name.startswith(hw.device_name)), None)


def check_target(meta: dict, world_size: int | None, device_name: str | None) -> None:
    """Refuse a run whose world size or GPU differs from the one the YAML was planned for.

    Args:
        meta: the YAML's header (:func:`lcmoe_recipes.emit.target_meta`): ``world_size``, ``hardware``.
        world_size: ranks found (:func:`detected_world_size`); None skips that check.
        device_name: the local GPU's name; None (no GPU) skips that check.

    Raises:
        LcmoeError: with the planned and the found values, and the two ways out.
    """
    planned = meta.get("world_size")
    if planned is not None and world_size is not None and world_size != planned:
        raise LcmoeError(f"this job has {world_size} ranks but the config was planned and validated for {planned}",
                         f"launch {planned} ranks, or pass --replan to plan again for {world_size}")
    hardware = meta.get("hardware")
    if hardware and device_name is not None:
        expected = get_hardware(hardware).device_name
        if not device_name.startswith(expected):
            raise LcmoeError(f"this job runs on '{device_name}' but the config was planned for {hardware} ('{expected}')",
                             "run on the planned GPUs, or pass --replan to plan again for these")


def check_versions(meta: dict, installed: dict[str, str | None]) -> str | None:
    """Refuse to run a YAML built with other megatron-core / megatron-bridge versions than ``installed``.

    Config fields, their defaults and upstream validation change between versions (a field renamed or added, a
    default flipped), so a config validated with one version is not validated for another.

    Args:
        meta: the YAML's header (:func:`lcmoe_recipes.emit.target_meta`: ``megatron_core``, ``megatron_bridge``).
        installed: :func:`lcmoe_recipes.emit.stack.installed_stack` where the job runs.

    Returns:
        None when they match; a warning line when the header records no versions (a YAML written before they were
        recorded, or one without our header).

    Raises:
        LcmoeError: a version differs (or is not installed), naming both sides and the two ways out.
    """
    recorded = {key: meta.get(key) for key in installed}
    if not any(recorded.values()):
        return ("warning: this YAML's header does not record the megatron-core / megatron-bridge versions it was "
                "built with, so they are not compared with the installed ones")
    if recorded == installed:
        return None

    def names(versions: dict) -> str:
        return " and ".join(f"{key.replace('_', '-')} {versions.get(key) or '(not installed)'}" for key in installed)

    raise LcmoeError(f"this config was built and validated with {names(recorded)}, but this job runs {names(installed)}",
                     f"run it where {names(recorded)} are installed (e.g. the --container-image the config was built "
                     "for), or build the config again with the installed versions: python -m lcmoe_recipes.launch ... "
                     "--dry-run where the job runs")


def replan(meta: dict, world_size: int, hardware: str, overrides: list[str]):
    """Plan again for the world size and GPU type found (:func:`lcmoe_recipes.resolve.resolve`: the named recipe for it, else
    the planner's best layout), then re-apply ``overrides``.

    Returns:
        (ConfigContainer, meta) for the new target.

    Raises:
        LcmoeError: the YAML's header lacks the model (written before re-planning existed), or no layout fits.
    """
    if not meta.get("model") or not meta.get("seq_length"):
        raise LcmoeError("this YAML's header does not name its model and seq_length, so it cannot be re-planned",
                         "write it again with the current `python -m lcmoe_recipes.launch ... --dry-run`")
    from . import emit
    from .request import TrainingRequest
    from .resolve import resolve

    best = resolve(TrainingRequest(model=meta["model"], seq_length=meta["seq_length"], hardware=hardware,
                                   num_gpus=world_size))
    cfg = emit.build_config(best, validate=False, quiet=True)
    emit.apply_overrides(cfg, overrides)
    return cfg, emit.target_meta(best, overrides)


def _require_gpu(device: str | None) -> None:
    if device is None:
        raise LcmoeError("no GPU on this rank: megatron-bridge's pretrain needs CUDA",
                         "run on GPU nodes (launch --executor slurm), or use --smoke for a CPU-only check")


def _rendezvous() -> dict[str, str]:
    missing = [var for var in RENDEZVOUS_VARS if var not in os.environ]
    if missing:
        raise LcmoeError(f"not started by torchrun: {', '.join(missing)} not set",
                         "start it through `python -m lcmoe_recipes.launch ... --executor local|slurm`, or torchrun")
    return {var: os.environ[var] for var in RENDEZVOUS_VARS}


def config_digest(cfg) -> str:
    """SHA-1 of the ConfigContainer's YAML (megatron-bridge's ``to_yaml``): equal on ranks that built the same config."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cfg.yaml"
        cfg.to_yaml(str(path))
        return hashlib.sha1(path.read_bytes()).hexdigest()


def _line(text: str) -> None:
    """One line in one write, so the ranks' lines never run together in a shared log."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def smoke(cfg, meta: dict, problems: list[str] = ()) -> int:
    """The CPU-only proof: gloo process group from torchrun's variables, one all-reduce, one all-gather of the config
    digest and of each rank's ``problems`` (paths missing on its node, :func:`lcmoe_recipes.job_paths.problems_here`).

    Returns:
        0 when every rank answered correctly and found every path; 2 when a node lacks a path (rank 0 prints one
        ``error: on node N: ...`` line per node and problem); 1 when a collective gave a wrong answer.
    """
    import torch
    import torch.distributed as dist

    rdv = _rendezvous()
    digest = config_digest(cfg)
    if rdv["RANK"] == "0":
        world = int(rdv["WORLD_SIZE"])
        try:
            check_target(meta, world, None)
            verdict = "matches the plan"
        except LcmoeError as exc:
            verdict = f"a training run would be refused ({exc.message})"
        _line(f"smoke: {meta.get('recipe', 'config')} validated for {meta.get('world_size')} x {meta.get('hardware')}; "
              f"this job has {world} rank(s): {verdict}")
    dist.init_process_group(backend="gloo")  # env:// -- the variables above, as megatron-bridge's NCCL init uses
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)
        answers: list = [None] * world
        dist.all_gather_object(answers, (digest, os.uname().nodename, list(problems)))
        expected = world * (world + 1) / 2
        same = len({answer[0] for answer in answers}) == 1
        missing = sorted({(node, problem) for _, node, found in answers for problem in found})
        _line(f"smoke rank {rank}/{world} on {os.uname().nodename} (master {rdv['MASTER_ADDR']}:{rdv['MASTER_PORT']}): "
              f"all_reduce {total.item():g} (expected {expected:g}), config {digest[:12]} "
              f"{'identical on every rank' if same else 'DIFFERS between ranks'}")
        if total.item() != expected or not same:
            print(f"error: smoke check failed on rank {rank}", file=sys.stderr, flush=True)
        elif missing and rank == 0:
            lines = [f"error: on node {node}: {problem}" for node, problem in missing]
            nodes = sorted({node for node, _ in missing})
            print("\n".join(lines) + f"\n  fix: make these paths exist on {', '.join(nodes)} (a filesystem every node "
                  "mounts at the same path; in a container, --container-mounts)", file=sys.stderr, flush=True)
        dist.barrier()  # every line is out before any rank exits (torchrun stops the others when one fails)
    finally:
        dist.destroy_process_group()
    if total.item() != expected or not same:
        return 1
    return 2 if missing else 0


def rank_arguments(group) -> None:
    """The options the entry script takes, on ``group`` (a parser or argument group; ``launch`` passes them on)."""
    group.add_argument("--data-path", nargs="+", metavar="PREFIX", help="real data: Megatron dataset prefixes "
                       "(.bin/.idx), optionally weighted: 0.7 /data/a 0.3 /data/b (default: mock data)")
    group.add_argument("--tokenizer", metavar="NAME_OR_DIR", help="Hugging Face tokenizer for real data")
    group.add_argument("--save-dir", metavar="DIR", help="absolute folder on shared storage for this run's "
                       "checkpoints (DIR/checkpoints: checkpoint.save, and checkpoint.load so a resubmitted job "
                       "resumes) and logs (DIR/tensorboard, DIR/wandb); default: nemo_experiments/<recipe>/ in the "
                       "ranks' working folder (the job's code folder under Slurm)")
    group.add_argument("--replan", action="store_true", help="when the world size or GPU the ranks find differs "
                       "from the plan, plan again for it instead of refusing to start")
    group.add_argument("--smoke", action="store_true", help="CPU-only check instead of training: every rank builds "
                       "and validates the config, joins a gloo process group, runs one all-reduce and one all-gather, "
                       "exits")


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m lcmoe_recipes.train", description=__doc__.split("\n\n")[1],
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", metavar="FILE", help="ConfigContainer YAML written by lcmoe_recipes.launch")
    source.add_argument("--recipe", metavar="NAME", help="a named recipe instead of a YAML (see launch --list)")
    rank_arguments(parser)
    parser.add_argument("--metrics", metavar="FILE", help="write each step's loss, wall time and peak allocated "
                        "memory to FILE as JSON (rank 0; lcmoe_recipes.metrics)")
    parser.add_argument("--as-rank", type=int, metavar="R", help="run global rank R of the full-size job alone on "
                        "this GPU (fake collectives, no torchrun) and report its peak memory beside our prediction")
    parser.add_argument("--steps", type=int, default=3, metavar="N", help="--as-rank: training steps (default 3)")
    parser.add_argument("--out", metavar="DIR", default="out/as_rank", help="--as-rank: where as_rank.json and "
                        "memory_snapshot.pickle go (default out/as_rank)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied before validation")
    return parser


CONVERT_POLL_SECONDS = 15
CONVERT_TIMEOUT_SECONDS = float(os.environ.get("LCMOE_CONVERT_TIMEOUT", 6 * 3600))


def weights_problems(weights: dict, model: str) -> list[str]:
    """What is wrong on THIS node with the weights the YAML header says the run starts from (``launch --from-hf /
    --from-checkpoint``): the folder is missing, incomplete or holds another model. A ``convert_to`` folder not yet
    converted is fine (rank 0 converts it at the start)."""
    from .catalog import get_model
    from .checkpoint_folders import CheckpointError, check_hf_folder, check_megatron_checkpoint

    spec = get_model(model)
    try:
        if weights.get("from_hf"):
            check_hf_folder(weights["from_hf"], spec)
        elif weights.get("from_checkpoint") and Path(weights["from_checkpoint"]).exists():
            check_megatron_checkpoint(weights["from_checkpoint"], spec)  # a previous phase's: absent until it ran
    except CheckpointError as exc:
        return [f"{exc.message} ({exc.fix})"]
    return []


def _converted(folder: str) -> bool:
    from .checkpoint_folders import CheckpointError, read_megatron_checkpoint

    try:
        read_megatron_checkpoint(folder)
    except CheckpointError:
        return False
    return True


def prepare_weights(weights: dict, model: str, rank0: bool) -> None:
    """``--from-hf DIR --convert-to OUT``: rank 0 converts DIR into OUT with megatron-bridge's converter
    (``python -m lcmoe_recipes.convert``, a process of its own, before torch.distributed starts) unless OUT already
    holds a complete conversion; the other ranks wait for OUT's tracker file (at most ``LCMOE_CONVERT_TIMEOUT``
    seconds, 6 h by default).

    Raises:
        LcmoeError: the conversion failed, or the wait timed out.
    """
    import subprocess
    import time

    out = weights.get("convert_to")
    if not out or _converted(out):
        return
    if rank0:
        _line(f"converting {weights['from_hf']} -> {out} (megatron-bridge AutoBridge; once, reused afterwards)")
        done = subprocess.run([sys.executable, "-m", "lcmoe_recipes.convert", "--hf", weights["from_hf"], "--out", out,
                               "--model", model])
        if done.returncode != 0:
            raise LcmoeError(f"converting {weights['from_hf']} into {out} failed (exit {done.returncode})",
                             "see the convert step's message above; or convert beforehand with python -m "
                             "lcmoe_recipes.convert and launch with --from-checkpoint")
        return
    deadline = time.monotonic() + CONVERT_TIMEOUT_SECONDS
    while not _converted(out):
        if time.monotonic() > deadline:
            raise LcmoeError(f"rank {os.environ.get('RANK')} waited {CONVERT_TIMEOUT_SECONDS:.0f} s for rank 0 to "
                             f"convert {weights['from_hf']} into {out}", "convert beforehand with python -m "
                             "lcmoe_recipes.convert, or raise LCMOE_CONVERT_TIMEOUT")
        time.sleep(CONVERT_POLL_SECONDS)


def as_rank(args) -> int:
    """``--as-rank R``: rank R of the job alone on this GPU (:mod:`lcmoe_recipes.emit.rank_run`)."""
    from . import emit
    from .emit import rank_run

    if args.steps < 1:
        raise LcmoeError(f"--steps {args.steps} is not a positive number of steps", "e.g. --steps 3")
    if args.config:
        meta = emit.read_meta(args.config)
        if note := check_versions(meta, installed_stack()):
            _line(note)
        cfg, meta = emit.read_yaml(args.config)
    else:
        from .recipes import recipe_plan

        plan = recipe_plan(args.recipe)
        meta = emit.target_meta(plan)
        cfg = emit.build_config(plan, validate=False, quiet=True)
    emit.apply_overrides(cfg, emit.data_overrides(args.data_path, args.tokenizer) + list(args.overrides))
    run = rank_run.prepare(cfg, meta, args.as_rank, args.steps)
    for line in run.changes:
        _line(f"as-rank: {line}")
    _line(rank_run.table(rank_run.measure(run, Path(args.out))))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point on every rank; returns the exit code."""
    args = _parser().parse_intermixed_args(argv)
    if args.as_rank is not None:
        try:
            return as_rank(args)
        except LcmoeError as exc:
            return exc.report()
    rank0 = os.environ.get("RANK", "0") == "0"
    try:
        if (folder := activate_overlay()) and rank0:  # the pinned wheels first on the import path, before any import
            _line(f"overlay {folder}: megatron-core and megatron-bridge import from it")
        from . import emit

        # The cheap refusals first, before megatron-bridge loads (15-40 s) and before torch.distributed or any GPU
        # work: the YAML's header (the versions it was built with), torchrun, the GPU.
        if args.config:
            meta = emit.read_meta(args.config)
        else:
            from .recipes import recipe_plan

            plan = recipe_plan(args.recipe)
            meta = emit.target_meta(plan)
        if (note := check_versions(meta, installed_stack())) and rank0:
            _line(note)
        world = detected_world_size()
        device = None
        if args.smoke:
            _rendezvous()
        else:
            import torch

            device = torch.cuda.get_device_properties(0).name if torch.cuda.is_available() else None
            if not args.replan:
                check_target(meta, world, device)
                _require_gpu(device)

        extra = (emit.save_overrides(args.save_dir) + emit.data_overrides(args.data_path, args.tokenizer)
                 + list(args.overrides))
        if args.config:
            cfg, meta = emit.read_yaml(args.config)
        else:
            cfg = emit.build_config(plan, validate=False, quiet=True)
        emit.apply_overrides(cfg, extra)
        weights = meta.get("weights") or {}
        paths_cfg = cfg
        if weights.get("convert_to") and not _converted(weights["convert_to"]):  # converted at the start: check DIR
            paths_cfg = copy.deepcopy(cfg)
            paths_cfg.checkpoint.pretrained_checkpoint = None
        if args.smoke:
            emit.validate_config(cfg, meta.get("hardware", "h100"), meta.get("world_size") or world or 1,
                                 meta.get("recipe", "config"))
            return smoke(cfg, meta, problems_here(paths_cfg) + weights_problems(weights, meta.get("model", "")))

        if args.replan and world is not None:
            found_hw = hardware_of_device(device) or meta.get("hardware")
            if (world, found_hw) != (meta.get("world_size"), meta.get("hardware")):
                cfg, meta = replan(meta, world, found_hw, list(meta.get("overrides", [])) + extra)
                if rank0:
                    _line(f"re-planned {meta['model']} seq_length {meta['seq_length']} for {world} x {found_hw}")
        check_target(meta, world, device)
        _require_gpu(device)
        emit.validate_config(cfg, meta.get("hardware", "h100"), world or meta.get("world_size", 1),
                             meta.get("recipe", "config"))
        if problems := problems_here(paths_cfg) + weights_problems(weights, meta.get("model", "")):
            raise LcmoeError(f"on node {os.uname().nodename}: " + "; ".join(problems),
                             "make the paths exist on every node (a shared filesystem; in a container, "
                             "--container-mounts), or check the job first with --smoke")
        prepare_weights(weights, meta.get("model", ""), rank0)
    except LcmoeError as exc:
        return exc.report()
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    callbacks = None
    if args.metrics:
        from .metrics import metrics_callback

        callbacks = [metrics_callback(args.metrics)]
    pretrain(cfg, forward_step, callbacks=callbacks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
