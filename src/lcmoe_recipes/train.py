"""Entry script run on every rank: ``python -m lcmoe_recipes.train --config FILE [options] [Hydra overrides...]``.

Rebuilds the ConfigContainer from the YAML ``launch`` wrote (or from a named recipe with ``--recipe``), applies
overrides (and ``--data-path`` / ``--tokenizer``), refuses to start when the world size or GPU type it finds differs
from what the config was planned for (``--replan`` plans again for what it finds instead), validates, and calls
megatron-bridge's ``pretrain`` with its GPT forward step. Mock data unless a dataset is given.

``--smoke`` is the CPU-only proof used by the tests and before queueing a big job: every rank rebuilds and validates
the config for its planned target, joins torch.distributed with the gloo backend through the same rendezvous
variables the GPU run uses (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` from torchrun), checks with one
all-reduce and one all-gather that every rank is there and built the same config, and exits 0 without training.

Exit codes: 0 done; 2 refused (world size, GPU, bad config or input); 1 the smoke collective gave a wrong answer.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from pathlib import Path

from .catalog import HARDWARE, get_hardware
from .errors import LcmoeError

RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
EPILOG = """\
Run it on every rank under torchrun, which sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK (the world
size is compared with the YAML's plan; under Slurm SLURM_NTASKS is used when WORLD_SIZE is unset). Usually
`python -m lcmoe_recipes.launch ... --executor local|slurm` starts it for you; by hand:

  python -m torch.distributed.run --standalone --nproc-per-node 2 -m lcmoe_recipes.train --config out/x.yaml --smoke
  torchrun --nnodes 32 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" \\
      -m lcmoe_recipes.train --config out/dsv3_128k_h100.yaml --data-path /data/web_text_document

--smoke: every rank validates the config for its planned target, joins a gloo process group, runs one all-reduce
and one all-gather (of a digest of its config), and exits 0 -- no GPU needed. Exit codes: 0 done; 2 refused
(world size, GPU, config, input); 1 a smoke collective gave a wrong answer.
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


def replan(meta: dict, world_size: int, hardware: str, overrides: list[str]):
    """Plan again for the world size and GPU type found (the planner's best layout), then re-apply ``overrides``.

    Returns:
        (ConfigContainer, meta) for the new target.

    Raises:
        LcmoeError: the YAML's header lacks the model (written before re-planning existed), or no layout fits.
    """
    if not meta.get("model") or not meta.get("seq_length"):
        raise LcmoeError("this YAML's header does not name its model and seq_length, so it cannot be re-planned",
                         "write it again with the current `python -m lcmoe_recipes.launch ... --dry-run`")
    from . import emit
    from .search import plan
    from .request import TrainingRequest

    best = plan(TrainingRequest(model=meta["model"], seq_length=meta["seq_length"], hardware=hardware,
                                num_gpus=world_size)).best.plan
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


def smoke(cfg, meta: dict) -> int:
    """The CPU-only proof: gloo process group from torchrun's variables, one all-reduce, one all-gather of the config
    digest. Returns 0 when every rank answered correctly, 1 otherwise."""
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
        digests: list = [None] * world
        dist.all_gather_object(digests, digest)
    finally:
        dist.destroy_process_group()
    expected = world * (world + 1) / 2
    same = len(set(digests)) == 1
    _line(f"smoke rank {rank}/{world} on {os.uname().nodename} (master {rdv['MASTER_ADDR']}:{rdv['MASTER_PORT']}): "
          f"all_reduce {total.item():g} (expected {expected:g}), config {digest[:12]} "
          f"{'identical on every rank' if same else 'DIFFERS between ranks'}")
    if total.item() != expected or not same:
        print(f"error: smoke check failed on rank {rank}", file=sys.stderr)
        return 1
    return 0


def rank_arguments(group) -> None:
    """The options the entry script takes, on ``group`` (a parser or argument group; ``launch`` passes them on)."""
    group.add_argument("--data-path", nargs="+", metavar="PREFIX", help="real data: Megatron dataset prefixes "
                       "(.bin/.idx), optionally weighted: 0.7 /data/a 0.3 /data/b (default: mock data)")
    group.add_argument("--tokenizer", metavar="NAME_OR_DIR", help="Hugging Face tokenizer for real data")
    group.add_argument("--replan", action="store_true", help="when the world size or GPU the ranks find differs "
                       "from the plan, plan again for it instead of refusing to start")
    group.add_argument("--smoke", action="store_true", help="CPU-only check instead of training: every rank builds "
                       "and validates the config, joins a gloo process group, runs one all-reduce and one all-gather, "
                       "exits")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lcmoe_recipes.train", description=__doc__.split("\n\n")[1],
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", metavar="FILE", help="ConfigContainer YAML written by lcmoe_recipes.launch")
    source.add_argument("--recipe", metavar="NAME", help="a named recipe instead of a YAML (see launch --list)")
    rank_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied before validation")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point on every rank; returns the exit code."""
    args = _parser().parse_intermixed_args(argv)
    rank0 = os.environ.get("RANK", "0") == "0"
    try:
        from . import emit

        # The cheap refusals first, before megatron-bridge loads (15-40 s): the YAML's header, torchrun, the GPU.
        if args.config:
            meta = emit.read_meta(args.config)
        else:
            from .recipes import recipe_plan

            plan = recipe_plan(args.recipe)
            meta = emit.target_meta(plan)
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

        extra = emit.data_overrides(args.data_path, args.tokenizer) + list(args.overrides)
        if args.config:
            cfg, meta = emit.read_yaml(args.config)
        else:
            cfg = emit.build_config(plan, validate=False, quiet=True)
        emit.apply_overrides(cfg, extra)
        if args.smoke:
            emit.validate_config(cfg, meta.get("hardware", "h100"), meta.get("world_size") or world or 1,
                                 meta.get("recipe", "config"))
            return smoke(cfg, meta)

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
    except LcmoeError as exc:
        return exc.report()
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    pretrain(cfg, forward_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
