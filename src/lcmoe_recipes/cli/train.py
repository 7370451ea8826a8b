"""Entry script run on every rank: ``python -m lcmoe_recipes.train --config FILE [options] [Hydra overrides...]``.

First, with ``$LCMOE_OVERLAY`` set (a Slurm job onto an image with other megatron versions), puts that overlay of the
pinned wheels first on the import path (:func:`lcmoe_recipes.jobs.node.activate`). Rebuilds the ConfigContainer from the
YAML ``launch`` wrote (or from a named recipe with ``--recipe``), applies overrides (and ``--data-path`` / ``--tokenizer`` / ``--save-dir``), refuses to start when the megatron-core /
megatron-bridge versions here differ from the ones the YAML was built with (before torch.distributed or any GPU
work), when the world size or GPU type it finds differs from what the config was planned for (``--replan`` plans
again for what it finds instead), or when a path the config reads is missing on this node; validates, and calls
megatron-bridge's ``pretrain`` with its GPT forward step. Mock data unless a dataset is given.

``--as-rank R`` runs global rank R of the full-size job alone on this machine's GPU, the other ranks answered by fake
collectives, for a few steps (``--steps``), and prints torch's peak allocated / reserved memory beside our prediction
for that rank, with a memory snapshot (:mod:`lcmoe_recipes.emit.probe.rank_run`; docs/build.md).

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

from ..errors import LcmoeError
from ..jobs.node import as_rank, run_rank
from .common import ArgumentParser, report_error


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
                        "memory to FILE as JSON (rank 0; lcmoe_recipes.jobs.metrics)")
    parser.add_argument("--drill", metavar="SPEC", help="one rank of the fault drill (launch --drill starts it): "
                        "train a small model on the CPU with gloo, save megatron-core torch_dist checkpoints, fire "
                        "the faults SPEC names, resume from the newest complete checkpoint (lcmoe_recipes.jobs.drill)")
    parser.add_argument("--as-rank", type=int, metavar="R", help="run global rank R of the full-size job alone on "
                        "this GPU (fake collectives, no torchrun) and report its peak memory beside our prediction")
    parser.add_argument("--steps", type=int, default=3, metavar="N", help="--as-rank: training steps (default 3)")
    parser.add_argument("--out", metavar="DIR", default="out/as_rank", help="--as-rank: where as_rank.json and "
                        "memory_snapshot.pickle go (default out/as_rank)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied before validation")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point on every rank; returns the exit code (:func:`lcmoe_recipes.jobs.node.run_rank`)."""
    args = _parser().parse_intermixed_args(argv)
    try:
        if args.drill:
            from ..jobs.drill import drill_rank

            return drill_rank(args.drill)
        if args.as_rank is not None:
            if args.steps < 1:
                raise LcmoeError(f"--steps {args.steps} is not a positive number of steps", "e.g. --steps 3")
            return as_rank(args.as_rank, args.config, args.recipe, steps=args.steps, out=args.out,
                           data_path=args.data_path, tokenizer=args.tokenizer, overrides=args.overrides)
        return run_rank(args.config, args.recipe, data_path=args.data_path, tokenizer=args.tokenizer,
                        save_dir=args.save_dir, replan_here=args.replan, smoke_only=args.smoke, metrics=args.metrics,
                        overrides=args.overrides)
    except LcmoeError as exc:
        return report_error(exc)
