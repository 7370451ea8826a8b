"""Calibrate the cost models to your cluster from your own training logs, and write a calibration profile.

    lcmoe-calibrate LOG [LOG ...] --config CONFIG [--gpus N] [--hardware NAME] [--out PROFILE.yaml]
    python -m lcmoe_recipes.calibrate ...

CONFIG is the ConfigContainer YAML the runs were launched with (or a named recipe); every LOG is one run of it
(megatron-bridge 0.6.2 or Megatron-LM output of the last rank, with throughput and memory logging). The profile
(YAML: the constants fitted for that GPU x precision, their spread, every run they came from) is what
``--calibration FILE`` hands to the cost models.
"""

from __future__ import annotations

import argparse

from ..calibration import calibrate, read_log, write_profile
from ..catalog import HARDWARE, get_hardware, load_model_config
from ..errors import LcmoeError
from ..planner.examine import config_plan
from .common import ArgumentParser, report_error


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m lcmoe_recipes.calibrate", description=__doc__.splitlines()[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", metavar="LOG", help="training log of one run (the last rank's output)")
    parser.add_argument("--config", required=True, help="the ConfigContainer YAML the runs used, or a named recipe")
    parser.add_argument("--gpus", type=int, help="GPUs of the runs (default: the YAML header's)")
    parser.add_argument("--hardware", help=f"GPU of the runs: {', '.join(HARDWARE)} (default: the YAML header's)")
    parser.add_argument("--model-config", metavar="PATH", help="config.json of a model not in the catalogue")
    parser.add_argument("--out", metavar="PROFILE", help="where to write the profile (default: "
                        "calibration_<hardware>_<precision>.yaml)")
    args = parser.parse_args(argv)
    try:
        if args.model_config:
            load_model_config(args.model_config)
        if args.hardware:
            get_hardware(args.hardware)
        plan = config_plan(args.config, args.gpus, args.hardware)
        profile = calibrate([(plan, read_log(log), args.config) for log in args.logs])
    except LcmoeError as exc:
        return report_error(exc)
    out = write_profile(profile, args.out or f"calibration_{profile.hardware}_{profile.precision}.yaml")
    print(f"calibration profile for {profile.hardware} at {profile.precision} from {len(profile.runs)} run(s): {out}")
    for (gpu, kind), value in profile.step_constants.items():
        lo, hi = profile.step_spread.get((gpu, kind), (value, value))
        print(f"  {gpu} {kind:<14} {value:<10g} (spread {lo:g} - {hi:g})")
    if profile.memory_overhead_bytes is not None:
        print(f"  memory overhead {profile.memory_overhead_bytes / 1e9:.2f} GB")
    for run in profile.runs:
        print(f"  {run['log']}: measured {run['tflops_per_gpu']} TFLOP/s/GPU; predicted {run['predicted_tflops_published']}"
              f" (published constants), {run['predicted_tflops_calibrated']} (calibrated)")
    print(f"use it: --calibration {out}")
    return 0

