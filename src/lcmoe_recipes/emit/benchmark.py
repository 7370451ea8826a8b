"""Training, not benchmark: what megatron-bridge's benchmark helper sets, and what each of those settings becomes here.

Every perf recipe of megatron-bridge 0.6.2 -- the bases our configs start from (:mod:`.upstream`) -- calls
``perf_recipes/_common.py`` ``_benchmark_common``, whose docstring says it "prioritize[s] throughput measurement over
convergence": 50 steps, no saves, no NaN checks, BF16 gradient reduction, per-step logging and more. The training
template of the same release is ``recipes/common.py`` ``_pretrain_common``.

:func:`benchmark_fields` runs the installed ``_benchmark_common`` on a ``_pretrain_common()`` config and diffs the
two field by field (every field it assigns is recorded too, so a field it sets to the training value is listed as
well); it runs on a few variants of the config so that each of the helper's branches (CUDA graphs on and off,
HybridEP, the TE op fuser, a mixed-precision object) is taken. :data:`BENCHMARK_FATES` gives every one of those fields
its fate: ``training`` (our config holds the training template's value), ``plan`` (one of our settings,
:data:`lcmoe_recipes.emit.settings.SETTINGS`, writes the run's own value) or ``kept`` (the benchmark's value stays,
for the stated reason). :func:`unhandled` names the fields upstream sets that have no fate (tests/test_parity.py fails
on any: a benchmark-only setting added upstream is not inherited silently); :func:`fate_findings` checks an emitted
config against the fates. docs/parity.md carries the table (``scripts/parity_report.py``).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from ..core.plan import Reason

UPSTREAM = "megatron-bridge 0.6.2"
BENCHMARK_SOURCE = f"{UPSTREAM} perf_recipes/_common.py _benchmark_common"
TEMPLATE_SOURCE = f"{UPSTREAM} recipes/common.py _pretrain_common"
ACTIONS = ("training", "plan", "kept")


@dataclass(frozen=True)
class Fate:
    """What one benchmark setting becomes in our configs.

    Attributes:
        action: ``training`` (the training template's value), ``plan`` (the run's own value, written by ``setting``)
            or ``kept`` (the benchmark's value, for ``reason``).
        reason: why.
        setting: the :data:`lcmoe_recipes.emit.settings.SETTINGS` key that writes the field (``training`` and
            ``plan``), or None where no setting of ours needs to (the base already holds the value).
    """

    action: str
    reason: Reason
    setting: str | None = None


def _fate(action: str, why: str, source: str, setting: str | None = None) -> Fate:
    return Fate(action, Reason(why, source), setting)


BENCHMARK_FATES: dict[str, Fate] = {
    "train.train_iters": _fate(
        "plan", "the extension's own step count (50 steps measure throughput, not a phase of training)",
        f"{BENCHMARK_SOURCE}; lcmoe_recipes.rules.schedule", "schedule"),
    "scheduler.lr_decay_iters": _fate(
        "plan", "the learning rate decays over the run's own steps", f"{BENCHMARK_SOURCE}; lcmoe_recipes.rules.schedule",
        "schedule"),
    "scheduler.lr_warmup_iters": _fate(
        "plan", "the run's own warm-up (10 steps suit a 50-step benchmark)",
        f"{BENCHMARK_SOURCE}; lcmoe_recipes.rules.schedule", "schedule"),
    "train.eval_iters": _fate(
        "training", "the deprecated field back to None (the benchmark's 0 would be copied over validation.eval_iters "
        "by validate() and turn evaluation off); validation.eval_iters carries the run's evaluation",
        f"{TEMPLATE_SOURCE}; {UPSTREAM} training/config.py TrainingConfig.eval_iters", "real_training"),
    "train.manual_gc": _fate(
        "training", "Python's garbage collector run by hand on every rank at once, as the training template also "
        "sets (automatic collections at different times on different ranks stall the collectives)",
        f"{TEMPLATE_SOURCE} (manual_gc=True)"),
    "train.manual_gc_interval": _fate(
        "training", "every 100 steps, the training template's interval", f"{TEMPLATE_SOURCE} (manual_gc_interval=100)"),
    "checkpoint.save": _fate(
        "plan", "a real run saves (the benchmark saves nothing); the folder and cadence are the run's",
        f"{BENCHMARK_SOURCE}; lcmoe_recipes.cost.wallclock save_intervals", "checkpoint"),
    "logger.tensorboard_dir": _fate(
        "plan", "TensorBoard logs beside the run's checkpoints (the benchmark writes none)", BENCHMARK_SOURCE,
        "checkpoint"),
    "logger.log_interval": _fate(
        "kept", "a log line every step: the long-context steps last seconds to minutes, so one line per step costs "
        "nothing measurable, and each step's TFLOP/s and loss are what a run's log is calibrated from (the template's "
        "10 would print once every several minutes to hours)",
        f"{BENCHMARK_SOURCE}; {TEMPLATE_SOURCE} (log_interval=10); lcmoe_recipes scripts/calibrate_step.py"),
    "ddp.check_for_nan_in_grad": _fate(
        "training", "NaN/Inf in the reduced gradients stops the run at the step it appears", TEMPLATE_SOURCE,
        "real_training"),
    "ddp.check_for_large_grads": _fate(
        "training", "off, the training template's (megatron-core's default) value: it re-runs steps whose gradient "
        "norm spikes, for fault attribution, and is not part of the training template",
        f"{TEMPLATE_SOURCE}; megatron-core 0.19.2 distributed/distributed_data_parallel_config.py"),
    "rerun_state_machine.check_for_nan_in_loss": _fate(
        "plan", "NaN/Inf in the loss stops the run (on, as the training template's default), except under "
        "full-iteration CUDA graphs, where the loss is not read back on the host each step",
        f"{TEMPLATE_SOURCE}; {UPSTREAM} training/config.py RerunStateMachineConfig", "real_training"),
    "ddp.grad_reduce_in_fp32": _fate(
        "training", "gradients accumulated and reduced in FP32 (summing hundreds of microbatches in BF16 loses "
        "gradient precision); its 4-byte buffer is priced and the layout chosen to fit it",
        f"{TEMPLATE_SOURCE} (grad_reduce_in_fp32=True); DeepSeek-V3 technical report arXiv 2412.19437 §3.3; "
        "lcmoe_recipes.rules.base GRAD_DTYPE", "grad_dtype"),
    "mixed_precision.grad_reduce_in_fp32": _fate(
        "training", "the same, on the mixed-precision config, whose value megatron-bridge's MixedPrecisionConfig.setup "
        "copies over the DDP field", f"{TEMPLATE_SOURCE}; {UPSTREAM} training/mixed_precision.py; "
        "lcmoe_recipes.rules.base GRAD_DTYPE", "grad_dtype"),
    "tokenizer.use_tokenizer_vocab_size": _fate(
        "kept", "the model's own vocabulary (config.json vocab_size, the embedding rows of its released weights), not "
        "the tokenizer's: true re-sizes the embedding and output layers to the tokenizer's padded count (megatron-"
        "bridge meant it for from-scratch pre-training), and released weights then do not load",
        f"{UPSTREAM} training/setup.py _validate_and_set_vocab_size; {BENCHMARK_SOURCE}"),
    "model.apply_rope_fusion": _fate(
        "kept", "the fused rotary kernel: the same rotation as the unfused one, a throughput choice only (megatron-"
        "bridge falls back to the unfused path itself where the fused kernel does not apply)",
        f"{BENCHMARK_SOURCE}; megatron-core 0.19.2 models/common/embeddings/rope_utils.py"),
    "model.cross_entropy_fusion_impl": _fate(
        "kept", "Transformer Engine's fused cross entropy, the same loss; its BF16-gradient bug is fixed from TE 2.18 "
        "and older images get the known issue te-fused-cross-entropy-bf16-grad",
        f"{BENCHMARK_SOURCE}; TransformerEngine PR #3193; docs/known_issues.md"),
    "model.use_transformer_engine_op_fuser": _fate(
        "kept", "the base recipe's own value: perf recipes that need TE's op fuser (HybridEP's per-rank expert "
        "capacity) set it back on after the helper; a kernel path with the same math",
        f"{BENCHMARK_SOURCE}; megatron-core 0.19.2 transformer/transformer_config.py"),
    "model.moe_hybridep_num_sms": _fate(
        "kept", "the SMs HybridEP's dispatch and combine kernels take (megatron-core routes it to "
        "moe_flex_dispatcher_num_sms): a speed setting with no effect on what is computed",
        f"{BENCHMARK_SOURCE}; megatron-core 0.19.2 transformer/transformer_config.py __post_init__"),
    "model.cuda_graph_scope": _fate(
        "plan", "the run's CUDA-graph modules (cuda_graph_modules; the deprecated scope alias left empty)",
        f"{BENCHMARK_SOURCE}; megatron-core 0.19.2 transformer/transformer_config.py", "cuda_graphs"),
    "model.use_te_rng_tracker": _fate(
        "plan", "TE's RNG tracker exactly when CUDA graphs run (megatron-core needs it to capture them)",
        f"{BENCHMARK_SOURCE}; megatron-core 0.19.2 transformer/cuda_graphs.py", "cuda_graphs"),
    "rng.te_rng_tracker": _fate(
        "plan", "the same, on the RNG config", f"{BENCHMARK_SOURCE}", "cuda_graphs"),
}


@dataclass(frozen=True)
class BenchmarkField:
    """One field ``_benchmark_common`` sets: the training template's value and the benchmark's (of the first
    variant that sets it)."""

    path: str
    training: Any
    benchmark: Any


class _Recorder:
    """Stands in for a config object while ``_benchmark_common`` runs: reads pass through (sub-configs wrapped in turn),
    every assignment is recorded by its dotted path and applied to the real object."""

    def __init__(self, target: Any, path: str, assigned: set[str]) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_assigned", assigned)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return _Recorder(value, f"{self._path}{name}.", self._assigned)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        self._assigned.add(f"{self._path}{name}")
        setattr(self._target, name, value)


def _variants(model) -> list[Any]:
    """``_pretrain_common()`` configs with ``model``, one per branch of the helper: as given, with a mixed-precision
    object instead of its name, with TE CUDA graphs on / off, with HybridEP and the TE op fuser."""
    from megatron.bridge.recipes.common import _pretrain_common
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    out = []
    for graphs, hybridep, mixed_object in ((None, False, False), ("none", True, True), ("transformer_engine", True, True)):
        cfg = _pretrain_common()
        cfg.model = copy.deepcopy(model)
        if mixed_object:
            cfg.mixed_precision = get_mixed_precision_config(cfg.mixed_precision)
        if graphs is not None:
            cfg.model.cuda_graph_impl = graphs
        if hybridep:
            cfg.model.moe_token_dispatcher_type, cfg.model.moe_flex_dispatcher_backend = "flex", "hybridep"
            cfg.model.use_transformer_engine_op_fuser = True
        out.append(cfg)
    return out


def benchmark_fields(model) -> dict[str, BenchmarkField]:
    """Every field the installed megatron-bridge's ``_benchmark_common`` sets on a ``_pretrain_common()`` config
    whose model is ``model`` (a model provider, e.g. a base recipe's ``cfg.model``; copied, not changed), over the
    variants that take each of its branches: the fields whose value it changes and the fields it assigns.

    Raises:
        ImportError: megatron-bridge is not installed.
    """
    from megatron.bridge.perf_recipes._common import _benchmark_common

    from .settings import flat_fields

    out: dict[str, BenchmarkField] = {}
    for cfg in _variants(model):
        before = flat_fields(cfg)
        assigned: set[str] = set()
        _benchmark_common(_Recorder(cfg, "", assigned))
        after = flat_fields(cfg)
        changed = {p for p in set(before) | set(after) if before.get(p, _ABSENT) != after.get(p, _ABSENT)}
        for path in sorted(changed | {p for p in assigned if p in after or p in before}):
            if path not in out:
                out[path] = BenchmarkField(path, before.get(path, _ABSENT), after.get(path, _ABSENT))
        for path in sorted(p for p in assigned if p not in after and p not in before and p not in out):
            out[path] = BenchmarkField(path, _ABSENT, _ABSENT)  # assigned but not a to_dict() field
    return out


def unhandled(fields: dict[str, BenchmarkField]) -> tuple[list[str], list[str]]:
    """(fields ``_benchmark_common`` sets that have no fate, fates of fields it no longer sets)."""
    return sorted(set(fields) - set(BENCHMARK_FATES)), sorted(set(BENCHMARK_FATES) - set(fields))


def fate_findings(cfg, fields: dict[str, BenchmarkField]) -> list[str]:
    """What in the emitted config ``cfg`` contradicts :data:`BENCHMARK_FATES` (empty: none): a ``training`` field
    whose value is not the training template's, a ``plan`` field that still holds the benchmark's value where it
    differs from the template's... or whose setting does not own it."""
    from .settings import SETTINGS, flat_fields

    flat = flat_fields(cfg)
    owners = {s.key: s for s in SETTINGS}
    out = []
    for path, fate in sorted(BENCHMARK_FATES.items()):
        if fate.setting is not None and (fate.setting not in owners or not owners[fate.setting].owns(path)):
            out.append(f"{path}: fate names setting '{fate.setting}', which does not own it")
        field = fields.get(path)
        if field is None or path not in flat:
            continue
        if fate.action == "training" and flat[path] != field.training:
            out.append(f"{path}: {flat[path]!r}, not the training template's {field.training!r}")
        if fate.action == "plan" and field.training != field.benchmark and flat[path] == field.benchmark \
                and path in _PLAN_MUST_DIFFER:
            out.append(f"{path}: still the benchmark's {flat[path]!r}")
    return out


# plan-valued fields whose benchmark value is never a training run's (50 steps, 10 warm-up steps, no saves, no logs)
_PLAN_MUST_DIFFER = ("train.train_iters", "scheduler.lr_decay_iters", "checkpoint.save", "logger.tensorboard_dir")


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()
