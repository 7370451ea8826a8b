"""Entry script run on every rank: ``python -m lcmoe_recipes.train --config FILE [Hydra overrides...]``.

Rebuilds the ConfigContainer from the YAML ``launch`` wrote, refuses to start when the world size or GPU type
differs from what the YAML was validated for, validates again, and calls megatron-bridge's ``pretrain`` with its
GPT forward step (mock data unless the config names a dataset). Needs GPUs and the full environment (TE).
"""

from __future__ import annotations

import argparse
import os
import sys

from .catalog import get_hardware
from .errors import LcmoeError


def detected_world_size() -> int | None:
    """World size from torchrun (``WORLD_SIZE``) or Slurm (``SLURM_NTASKS``), None when neither is set."""
    for var in ("WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def check_target(meta: dict, world_size: int | None, device_name: str | None) -> None:
    """Refuse a run whose world size or GPU differs from the one the YAML was planned for.

    Raises:
        LcmoeError: with the planned and the found values.
    """
    planned = meta.get("world_size")
    if planned is not None and world_size is not None and world_size != planned:
        raise LcmoeError(f"this job has {world_size} ranks but the config was planned and validated for {planned}",
                         f"launch {planned} ranks, or re-plan: python -m lcmoe_recipes.launch ... --gpus {world_size}")
    hardware = meta.get("hardware")
    if hardware and device_name is not None:
        expected = get_hardware(hardware).device_name
        if not device_name.startswith(expected):
            raise LcmoeError(f"this job runs on '{device_name}' but the config was planned for {hardware} ('{expected}')",
                             "run on the planned GPUs, or re-plan with --hardware for these")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lcmoe_recipes.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="ConfigContainer YAML written by lcmoe_recipes.launch")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied before validation")
    args = parser.parse_intermixed_args(argv)
    try:
        from . import emit

        cfg, meta = emit.read_yaml(args.config)
        emit.apply_overrides(cfg, args.overrides)
        import torch

        device = torch.cuda.get_device_properties(0).name if torch.cuda.is_available() else None
        world = detected_world_size()
        check_target(meta, world, device)
        if device is None:
            raise LcmoeError("no GPU on this rank: megatron-bridge's pretrain needs CUDA",
                             "run under torchrun/srun on the GPU nodes")
        emit.validate_config(cfg, meta.get("hardware", "h100"), world or meta.get("world_size", 1), meta.get("recipe", "config"))
    except LcmoeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    pretrain(cfg, forward_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
