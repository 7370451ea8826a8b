"""What the commands share: the argument parser that reports usage errors like every other error, the flags of a
:class:`~lcmoe_recipes.core.request.TrainingRequest`, and turning parsed flags into one (the only place a Namespace
becomes a request)."""

from __future__ import annotations

import argparse
import re
import sys

from ..catalog import MODELS
from ..core.request import ROPE_CHOICES, TrainingRequest

# a number argparse would otherwise read as an option (it knows -1 and -0.5, not -1e-5)
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


FIX = "; fix: "
"""Between an ``argparse.ArgumentTypeError``'s message and its fix: :class:`ArgumentParser` prints the fix on its own
line (else it points at ``--help``)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the commands' error format: one ``error: ...`` line and a ``  fix: ...`` line (exit 2), not the
    whole usage block; and a negative number after an option that takes a value is that value (``--lr -1e-5``,
    ``--seq -4096``), so the request's own check answers it with its fix."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        message, _, fix = message.partition(FIX)  # a type check's own fix, where it gives one
        print(f"error: {message}", file=sys.stderr)
        print(f"  fix: {fix or f'see {self.prog} --help'}", file=sys.stderr)
        sys.exit(2)

    def _joined(self, args: list[str]) -> list[str]:
        takes_value = {s for a in self._actions if a.option_strings and a.nargs != 0 for s in a.option_strings}
        out: list[str] = []
        for token in args:
            if out and out[-1] in takes_value and _NEGATIVE_NUMBER.match(token):
                out[-1] = f"{out[-1]}={token}"
            else:
                out.append(token)
        return out

    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(self._joined(list(sys.argv[1:] if args is None else args)), namespace)

    def parse_known_intermixed_args(self, args=None, namespace=None):
        return super().parse_known_intermixed_args(self._joined(list(sys.argv[1:] if args is None else args)),
                                                   namespace)


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a GPU count or a comma-separated list of them{FIX}give "
                                         "e.g. 256 or 256,512")
    if len(set(counts)) < len(counts):  # 256,256 planned the same target twice, side by side
        twice = sorted({c for c in counts if counts.count(c) > 1})
        raise argparse.ArgumentTypeError(f"'{text}' lists {', '.join(map(str, twice))} more than once{FIX}give each "
                                         f"once: --gpus {','.join(map(str, dict.fromkeys(counts)))}")
    return counts


def model_argument(parser, what: str = "") -> None:
    """The positional MODEL every planning command takes."""
    parser.add_argument("model", nargs="?", help=f"a catalogue model ({', '.join(MODELS)}; aliases such as "
                        f"deepseek_v3 work){what}, or the path of a config.json (also --model-config PATH)")


def request_arguments(parser, target: bool = True, several_gpus: bool = False) -> None:
    """The TrainingRequest flags shared by ``plan`` and ``launch``: the target (``target``; ``several_gpus``: a
    comma-separated --gpus list, required), wishes and run options."""
    if target:
        if several_gpus:
            parser.add_argument("--gpus", type=_counts, metavar="N[,N...]", required=True, help="GPU count "
                                "(num_gpus); several, comma-separated, are planned side by side")
        else:
            parser.add_argument("--gpus", type=int, metavar="N", help="GPU count (default: the named recipe's)")
        parser.add_argument("--hardware", metavar="NAME", help="GPU type: h100, h200, b200, gb200, gb300" +
                            (" (required, unless --compare gives several)" if several_gpus else
                             " (default: the named recipe's)"))
        parser.add_argument("--precision", help="bf16, fp8_blockwise, fp8_cs or mxfp8 (default: the base model's "
                            "training precision on this GPU, else BF16)")
    parser.add_argument("--model-config", metavar="PATH", help="your model's Hugging Face config.json (or a folder "
                        "holding one), instead of a catalogue MODEL: any architecture megatron-bridge can build")
    parser.add_argument("--gbs", type=int, help="global batch size (default: --tokens-per-step / seq_length)")
    parser.add_argument("--mbs", type=int, help="micro batch size (default: a named recipe's 1; planned: the search "
                        "tries 1, 2 and 4 where memory and shapes allow)")
    parser.add_argument("--dispatcher", help="deepep, hybridep or alltoall (default: by hardware)")
    for name, what in (("tp", "tensor"), ("pp", "pipeline"), ("cp", "context"), ("ep", "expert")):
        parser.add_argument(f"--{name}", type=int, metavar="N", help=f"fix the {what}-parallel size {name.upper()} "
                            "(the search plans the rest around it; default: searched)")
    parser.add_argument("--no-offload", action="store_true", help="never offload optimizer state to the CPU")
    parser.add_argument("--variable-length", action="store_true", help="packed / variable-length batches")
    parser.add_argument("--memory-margin", type=float, metavar="F", help="fraction of HBM the plan keeps free "
                        "(default 0.05: the predicted HBM use -- allocator peak and the buffers outside it -- may "
                        "reach 95%% of HBM), e.g. 0.1")
    parser.add_argument("--rope", choices=ROPE_CHOICES, default="auto", help="positions: auto (keep RoPE when "
                        "seq_length fits the trained range, else YaRN), yarn, abf (raise the RoPE base) or keep")
    parser.add_argument("--tokens-per-step", type=int, metavar="N", help="tokens per optimizer step; GBS follows "
                        "(default: the base model's pre-training batch where published, DeepSeek-V3 63M; else ~8M "
                        "tokens above 100B parameters, ~4M below)")
    parser.add_argument("--lr", type=float, help="learning rate of the phase (default: the base model's final LR, "
                        "constant after a short warm-up)")
    parser.add_argument("--train-iters", type=int, metavar="N", help="optimizer steps of the phase (default 1000)")
    parser.add_argument("--calibration", metavar="PROFILE", help="a calibration profile from your own runs "
                        "(lcmoe-calibrate): plans are ranked and fitted with its constants, and shown beside the "
                        "published fit's")


# parsed flag -> TrainingRequest field, for the flags whose names differ
_FIELDS = {"gbs": "global_batch_size", "mbs": "micro_batch_size", "gpus": "num_gpus", "model_config": "model_config",
           "seq": "seq_length", "from_config": "from_config"}
# TrainingRequest field -> its flag, where the two differ beyond '_' -> '-' (and the fields with no flag of their own)
FLAGS = {"global_batch_size": "--gbs", "micro_batch_size": "--mbs", "num_gpus": "--gpus", "seq_length": "--seq",
         "from_config": "--from", "allow_cpu_offload": "--no-offload", "recipe": "RECIPE", "model": "MODEL",
         "mount": "--pvc-mount", "image": "--container-image"}


def flag_of(field: str) -> str:
    """The command-line flag of a TrainingRequest ``field`` (``seq_length`` -> ``--seq``)."""
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def as_flags(text: str, fields) -> str:
    """``text`` (a library error's message or fix) with each of ``fields`` written as its flag: ``seq_length=131072``
    -> ``--seq 131072``, and a field named in backticks, ```seq_length``` -> ``--seq`` (a bare word stays: ``no time
    limit`` is prose, not the ``time`` field)."""
    for name in fields:
        flag = flag_of(name)
        text = re.sub(rf"(?<![\w.-]){re.escape(name)}=(?=\S)", f"{flag} ", text).replace(f"`{name}`", flag)
    return text


_REQUEST_FLAGS = ("precision", "gbs", "mbs", "dispatcher", "tp", "pp", "cp", "ep", "memory_margin", "rope",
                  "tokens_per_step", "lr", "train_iters", "model_config", "variable_length", "gpus", "hardware", "seq",
                  "from_hf", "from_checkpoint", "convert_to", "from_config", "save_dir", "tokenizer", "fs_gbps",
                  "mtbf_hours",
                  "calibration", "calibration_run")


def request_from_args(args: argparse.Namespace, named: tuple[str, ...] = (), **fields) -> TrainingRequest:
    """The TrainingRequest the parsed flags ask for; ``fields`` win (e.g. one target of a comparison).

    Args:
        named: names that are named recipes: a MODEL that is one becomes ``recipe``.

    Raises:
        LcmoeError: every bad field at once, with the fixes the checks name; ModelConfigError: a bad config.json.
    """
    values: dict = {}
    for flag in _REQUEST_FLAGS:
        value = getattr(args, flag, None)
        if value is not None and value is not False and not (flag == "rope" and value == "auto"):
            values[_FIELDS.get(flag, flag)] = value
    if getattr(args, "no_offload", False):
        values["allow_cpu_offload"] = False
    if getattr(args, "data_path", None):
        values["data_path"] = tuple(args.data_path)
    model = getattr(args, "model", None)
    overrides = tuple(getattr(args, "overrides", None) or ())
    if model and is_override(model):  # `--model-config PATH key=value`: argparse gave the first override to MODEL
        model, overrides = None, (model,) + overrides
    if overrides:
        values["overrides"] = overrides
    if getattr(args, "phases", None):
        values["phases"] = phase_lengths(args.phases)
    if model:
        values["recipe" if model in named else "model"] = model
    return TrainingRequest.parse(**{**values, **fields})


def is_override(token: str) -> bool:
    """A Hydra override (``key=value``, ``+key=value``, ``~key``) rather than a model name or a path."""
    return token.startswith(("+", "~")) or ("=" in token and not token.startswith(("/", ".")))


def phase_lengths(text: str) -> tuple[int, ...]:
    """``--phases 32768,131072`` as lengths (the request checks their order).

    Raises:
        LcmoeError: not a comma-separated list of integers.
    """
    from ..errors import LcmoeError

    try:
        lengths = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise LcmoeError(f"--phases {text!r} is not a comma-separated list of token counts",
                         "e.g. --phases 32768,131072") from None
    return lengths


def report_error(exc, as_json: bool = False, warnings: list = ()) -> int:
    """Print an error (the other errors and the warnings found so far too) as text on stderr -- ``error: ...`` and
    ``  fix: ...``, the request fields it names written as this command line's flags (:func:`as_flags`) -- or as JSON
    on stdout; returns its exit code."""
    import dataclasses
    import json

    others = list(getattr(exc, "findings", [])[1:])
    message, fix = (as_flags(text, getattr(exc, "fields", ())) for text in (exc.message, exc.fix))
    if as_json:
        print(json.dumps({"valid": False, "error": message, "fix": fix,
                          "findings": [dataclasses.asdict(f) for f in others + list(warnings)]}, indent=2))
        return exc.exit_code
    print(f"error: {message}", file=sys.stderr)
    if fix:
        print(f"  fix: {fix}", file=sys.stderr)
    from ..report.text import short_finding

    for finding in others:  # a known upstream issue by its title and sources: the error and its fix stay in view
        print(f"  also: [{finding.severity}] {short_finding(finding)}", file=sys.stderr)
    for finding in warnings:
        print(f"  warning: {finding}", file=sys.stderr)
    return exc.exit_code


def write_plot_files(plans: list, folder, request: TrainingRequest | None = None) -> list:
    """memory.png and time.png of ``plans`` side by side, and sweep.png: the search's pick from 4K to 256K for
    ``request`` (default: the first plan's model, hardware and GPU count) -- the search runs here, the plots
    module only draws.

    Raises:
        LcmoeError: matplotlib is missing.
    """
    from ..report.plots import write_plots
    from ..planner.resolve import seq_sweep
    from ..planner.search import memory_limit

    first = plans[0]
    request = request or TrainingRequest(model=first.model, seq_length=first.seq_length, hardware=first.hardware,
                                         num_gpus=first.layout.world)
    sweep = [(seq, c.memory.hbm_total, c.step.tflops_per_gpu, c.plan.layout.cp) for seq, c in seq_sweep(request)]
    limit = memory_limit(first.model_spec, first.hardware_spec, request.memory_margin)
    return write_plots(plans, folder, limit, sweep)


def calibrated_line(plan, profile_path: str) -> str:
    """``plan``'s predictions with a calibration profile's constants beside the published fit's, one line.

    Raises:
        CalibrationError: a profile that cannot be read.
    """
    from ..calibration import read_profile

    p = read_profile(profile_path).predictions(plan)
    return (f"with {profile_path}: step {p['step_s_calibrated']:.1f} s (published fit {p['step_s_published']:.1f} s), "
            f"{p['tflops_calibrated']:.0f} TFLOP/s per GPU ({p['tflops_published']:.0f}), HBM use "
            f"{p['hbm_gib_calibrated']:.1f} GiB ({p['hbm_gib_published']:.1f})")



def read_back(cfg, hardware, world_size: int, container_image: str | None = None, overlay: bool = True):
    """The effective settings megatron derives from ``cfg`` for ``world_size`` GPUs of ``hardware``
    (:func:`lcmoe_recipes.emit.effective.effective_settings`), with megatron-core's Transformer Engine gates answered
    for the TE the job runs (``container_image``'s, else the target's: :func:`lcmoe_recipes.checks.known_issues.
    job_versions`), so the check's read-back of the same config is reused, not built again.

    Returns:
        (:class:`lcmoe_recipes.emit.effective.EffectiveSettings`, None), or (None, why not) where megatron-bridge
        rejects the config (its errors, printed with their fixes, come first) or torch.distributed is initialised.
    """
    from ..checks.known_issues import job_versions
    from ..emit.effective import effective_settings
    from ..errors import LcmoeError

    versions, _ = job_versions(container_image, overlay)
    try:
        return effective_settings(cfg, hardware, world_size,
                                  te_version=versions.versions.get("transformer-engine")), None
    except LcmoeError as exc:
        return None, f"not read back: {exc.message} (fix: {exc.fix})"


def effective_text(found) -> str:
    """The ``--explain`` section of :func:`read_back`'s answer ``found``."""
    from ..emit.effective import HEADING

    settings, why = found
    return settings.section() if settings is not None else f"{HEADING}:\n  {why}"


def effective_json(found) -> dict:
    """The ``--json`` value (key ``effective``) of :func:`read_back`'s answer ``found``: every value with what the
    config states, what runs and its source, megatron's logged warnings and the stand-ins; or ``{"error": why}``."""
    settings, why = found
    return settings.as_dict() if settings is not None else {"error": why}
