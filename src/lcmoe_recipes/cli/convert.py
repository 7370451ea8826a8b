"""``python -m lcmoe_recipes.convert --hf DIR --out DIR [--model NAME]``: a local Hugging Face checkpoint -> a Megatron
distributed checkpoint for ``checkpoint.pretrained_checkpoint``, with megatron-bridge's own converter
(:func:`lcmoe_recipes.emit.convert.convert_hf_checkpoint`).

Run it as the step before training (on a GPU node: saving needs CUDA). It first checks that DIR's config.json is the
model named by ``--model`` (default: the catalogue model whose numbers DIR's config.json has) and that every weight
file is there; an ``--out`` that already holds a complete conversion of DIR is reused, anything else there is refused.
``--check`` stops after the checks (no torch, no megatron: fine on a login node). Exit codes: 0 done (or reused);
2 refused (bad folder, wrong model, no GPU, a part that needs Transformer Engine).
"""

from __future__ import annotations

import argparse
import sys

from ..catalog import get_model
from ..checks.weights import CheckpointError, check_hf_folder, matching_models, read_hf_config
from ..errors import LcmoeError
from .common import ArgumentParser, report_error


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m lcmoe_recipes.convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf", required=True, metavar="DIR", help="local Hugging Face folder (config.json + weights)")
    parser.add_argument("--out", metavar="DIR", help="Megatron checkpoint folder to write (or reuse)")
    parser.add_argument("--model", metavar="NAME", help="catalogue model the folder must hold (default: the one "
                        "whose numbers its config.json has)")
    parser.add_argument("--drop-mtp", action="store_true", help="leave multi-token-prediction layers out (they need "
                        "Transformer Engine in megatron-bridge 0.6.2); train with model.mtp_num_layers=null")
    parser.add_argument("--check", action="store_true", help="only check the folder against the model; convert nothing")
    return parser


def model_of_folder(hf_dir: str, name: str | None):
    """The catalogue entry ``name``, or the one whose numbers ``hf_dir/config.json`` has.

    Raises:
        CheckpointError: no name given and no (or more than one) catalogue model matches the folder.
        UnknownName: ``name`` is not in the catalogue.
    """
    if name:
        return get_model(name)
    config = read_hf_config(hf_dir)
    found = matching_models(config)
    if len(found) != 1:
        what = (f"no catalogue model has the numbers of '{hf_dir}/config.json' (model_type "
                f"{config.get('model_type')!r}, {config.get('num_hidden_layers')} layers, hidden_size "
                f"{config.get('hidden_size')})") if not found else f"'{hf_dir}' matches several models: {', '.join(found)}"
        raise CheckpointError(what, "name the model with --model to see which numbers differ")
    return get_model(found[0])


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        spec = model_of_folder(args.hf, args.model)
        if args.check:
            check_hf_folder(args.hf, spec)
            print(f"convert: '{args.hf}' holds {spec.display} ({spec.key}) with its weights")
            return 0
        if not args.out:
            raise LcmoeError("--out is required unless --check is given", "add --out DIR (the Megatron checkpoint folder)")
        from ..emit.convert import convert_hf_checkpoint

        convert_hf_checkpoint(args.hf, args.out, spec, drop_mtp=args.drop_mtp)
    except LcmoeError as exc:
        return report_error(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
