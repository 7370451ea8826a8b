"""Build the real megatron-core model of every pipeline stage of a config, at its full world size, on a CPU.

``build_ranks(cfg, hardware, world_size)`` stands up the config's whole world in this one process on
torch.distributed's ``fake`` backend (as Megatron-LM's ``--fake-process-group``), creates megatron-core's process
groups with megatron-bridge 0.6.2's own ``_initialize_distributed`` (what ``initialize_megatron`` calls), and, for
each pipeline rank, builds the model the run builds -- every virtual-pipeline chunk -- through the config's own
provider (``provide_distributed_model``: megatron-bridge's ``get_model`` with ``use_cpu_initialization=True,
init_model_with_meta_device=True``), wrapped in megatron-core's ``DistributedDataParallel`` with the config's DDP
settings, as ``training/setup.py`` (``_build_distributed_model``) wraps it. Weights and DDP buffers live on the meta
device: no GPU and no real memory. What it counts, per stage: dense and expert parameter bytes (expert = what DDP
puts in its expert-parallel buffers, ``param.allreduce == False``), gradient-buffer bytes (and the buckets' padding),
decoder and MTP layers per chunk -- beside our memory model's numbers for the same stage
(:func:`lcmoe_recipes.cost.memory.rank_memory`).

Each stage is built at the rank whose other coordinates are all 0 and again at its "far corner" (the last TP, CP,
EP/ETP and DP rank of the stage); stages whose parameter shapes differ between the two are reported as two
coordinate classes. Before the stages, the config is validated for its target exactly as the check does
(``runtime_config_update`` inside :func:`lcmoe_recipes.emit.target.target_environment`) on a copy.

What the build proves: megatron-core 0.19.2 / megatron-bridge 0.6.2 construct this model, on these process groups,
with these shapes; the parameter and gradient bytes every rank holds. What it cannot: anything a forward or backward
pass does (the kernels, FP8 scaling, CUDA graphs, DeepEP / HybridEP buffers, NCCL, activations), and, without
Transformer Engine, TE's modules themselves (the local modules hold the same weights: TE fuses a norm into the next
linear layer, the same weight either way). docs/build.md.

The copy it builds differs from the config only where a CPU or the missing library makes it (:class:`BuildChange`,
each with its reason and upstream line), and the code it runs only by the named, build-scoped stand-ins of
:mod:`lcmoe_recipes.emit.build_substitutions`. Both lists are part of the report.
"""

from __future__ import annotations

import contextlib
import copy
import io
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ..catalog import Hardware, get_hardware
from ..checks import Finding
from ..errors import LcmoeError
from ..plan import stage_decoder_layers
from . import build_substitutions as subs
from .local_impl import switch_to_local
from .stack import load_bridge, quiet_upstream, te_installed
from .target import target_environment

BUILD_RULE = "build/stage"


@dataclass(frozen=True)
class BuildChange:
    """One field of the build's copy of the config that differs from the config: ``field: old -> new``, why."""

    field: str
    old: object
    new: object
    why: str

    def __str__(self) -> str:
        return f"{self.field}: {self.old!r} -> {self.new!r} ({self.why})"


@dataclass(frozen=True)
class ChunkBuild:
    """One virtual-pipeline chunk as built: layers and parameter bytes."""

    vp_stage: int
    decoder_layers: int
    mtp_layers: int
    dense_bytes: int
    expert_bytes: int


@dataclass(frozen=True)
class StageBuild:
    """One pipeline rank as built, beside our memory model's numbers for it.

    Attributes:
        pp_rank, global_rank: the pipeline rank and the world rank built (TP = CP = EP = DP rank 0).
        coordinates: that rank's megatron-core ranks (tp, cp, ep, etp, dp, edp).
        chunks: its virtual-pipeline chunks.
        grad_buffer_bytes: DDP's gradient buffers (dense and expert), padding included.
        grad_padding_bytes: the part of ``grad_buffer_bytes`` that pads buckets (distributed optimizer shards).
        param_buffer_bytes: DDP's parameter buffers (the distributed optimizer's; the parameters are views of them).
        predicted_dense_bytes, predicted_expert_bytes, predicted_gradient_bytes: our memory model, same stage.
        predicted_decoder_layers, predicted_mtp_layers: our pipeline split, per chunk.
        coordinate_classes: 1 when the far-corner rank of the stage built the same shapes, else 2.
        seconds: build time of this stage (both ranks).
    """

    pp_rank: int
    global_rank: int
    coordinates: dict[str, int]
    chunks: tuple[ChunkBuild, ...]
    grad_buffer_bytes: int
    grad_padding_bytes: int
    param_buffer_bytes: int
    predicted_dense_bytes: float
    predicted_expert_bytes: float
    predicted_gradient_bytes: float
    predicted_decoder_layers: tuple[int, ...]
    predicted_mtp_layers: int
    coordinate_classes: int = 1
    seconds: float = 0.0

    @property
    def dense_bytes(self) -> int:
        return sum(c.dense_bytes for c in self.chunks)

    @property
    def expert_bytes(self) -> int:
        return sum(c.expert_bytes for c in self.chunks)

    @property
    def decoder_layers(self) -> tuple[int, ...]:
        return tuple(c.decoder_layers for c in self.chunks)

    @property
    def mtp_layers(self) -> int:
        return sum(c.mtp_layers for c in self.chunks)

    @property
    def residuals(self) -> dict[str, float]:
        """Built minus predicted, bytes: dense and expert parameters, and gradients (bucket padding excluded)."""
        return {"dense": self.dense_bytes - self.predicted_dense_bytes,
                "expert": self.expert_bytes - self.predicted_expert_bytes,
                "gradients": self.grad_buffer_bytes - self.grad_padding_bytes - self.predicted_gradient_bytes}


@dataclass(frozen=True)
class BuildReport:
    """What :func:`build_ranks` built.

    Attributes:
        name, hardware, world_size: the config and its target.
        implementation: "transformer_engine" (TE installed: TE's modules) or "local" (megatron-core's own modules).
        stages: one per pipeline rank built (empty when nothing was built).
        changes: the build copy's fields that differ from the config.
        substitutions: the build-only stand-ins used (:class:`lcmoe_recipes.emit.build_substitutions.Substitution`).
        findings: errors (a stage that did not build, the config not validating, a stand-in that no longer matches
            upstream) and notes; never a traceback.
        not_built: why nothing was built (e.g. "needs Transformer Engine"), else None.
        seconds: wall time of the whole build (validation and every stage).
    """

    name: str
    hardware: str
    world_size: int
    implementation: str
    stages: tuple[StageBuild, ...] = ()
    changes: tuple[str, ...] = ()
    substitutions: tuple = ()
    findings: tuple[Finding, ...] = ()
    not_built: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def table(self) -> str:
        """The per-stage table (GiB = 2**30 bytes), the changes and the stand-ins, as text."""
        impl = "Transformer Engine modules" if self.implementation == "transformer_engine" else \
            "megatron-core's local modules (Transformer Engine not installed)"
        lines = [f"build: {self.name} at its full world size ({self.world_size} ranks, {self.hardware}) on the CPU, "
                 f"fake process groups, meta device; {impl}; {self.seconds:.1f} s"]
        if self.not_built:
            lines.append(f"  not built: {self.not_built}")
        if self.stages:
            lines.append("  PP  rank  decoder layers/chunk  MTP  dense GiB (ours)   expert GiB (ours)  "
                         "grad buffer GiB (ours)  classes")
            for s in self.stages:
                layers = ",".join(map(str, s.decoder_layers))
                same = "" if s.decoder_layers == s.predicted_decoder_layers else \
                    f" (ours {','.join(map(str, s.predicted_decoder_layers))})"
                lines.append(
                    f"  {s.pp_rank:>2} {s.global_rank:>5}  {layers + same:<20} {s.mtp_layers:>4}  "
                    f"{_gib(s.dense_bytes)} ({_gib(s.predicted_dense_bytes)})  "
                    f"{_gib(s.expert_bytes)} ({_gib(s.predicted_expert_bytes)})  "
                    f"{_gib(s.grad_buffer_bytes)} ({_gib(s.predicted_gradient_bytes)})  {s.coordinate_classes:>3}")
            worst = max((abs(v) for s in self.stages for v in s.residuals.values()), default=0)
            lines.append("  parameters and gradients (less bucket padding) equal our memory model's, byte for byte"
                         if worst == 0 else f"  largest difference from our memory model: {worst:,.0f} bytes")
        if self.changes:
            lines.append("  the build's copy differs from the config in:")
            lines += [f"    {c}" for c in self.changes]
        if self.substitutions:
            lines.append("  build-only stand-ins (change no weight; docs/build.md):")
            lines += [f"    {s.describe()}" for s in self.substitutions]
        for f in self.findings:
            lines.append(f"  {f.severity} {f.rule}: {f.message}\n          fix: {f.fix}")
        return "\n".join(lines)


def _gib(value: float) -> str:
    return f"{value / 2**30:8.3f}"


def _changes_before_validation(trial) -> list[BuildChange]:
    """Fields megatron-bridge reads at process-group set-up, changed on the build copy."""
    out = [BuildChange("dist.distributed_backend", trial.dist.distributed_backend, "fake",
                       "torch.distributed's fake backend stands up the whole world in one process; megatron-bridge "
                       "0.6.2 training/initialize.py:762 refuses 'nccl' where no CUDA device is present")]
    if trial.dist.use_gloo_process_groups:
        out.append(BuildChange("dist.use_gloo_process_groups", True, False, "gloo groups on a FakeStore crash the "
                               "process; they carry CPU-side collectives, no weight"))
    return out


def _changes_after_validation(model, local: bool) -> list[BuildChange]:
    """Fields of the validated provider that pick a kernel or library the CPU build cannot load (no weight)."""
    out = []
    if model.moe_token_dispatcher_type == "flex" and not _flex_backend_installed(model.moe_flex_dispatcher_backend):
        out.append(BuildChange("model.moe_token_dispatcher_type", "flex", "alltoall",
                               f"the flex dispatcher needs {model.moe_flex_dispatcher_backend or 'DeepEP'} installed "
                               "(megatron-core 0.19.2 transformer/moe/token_dispatcher.py:1274); a dispatcher moves "
                               "tokens and holds no weight"))
    if local and model.fp8:
        out.append(BuildChange("model.fp8", model.fp8, None, "FP8 modules are Transformer Engine's; the weights are "
                               + ("FP8 in the run (fp8_param) and built here in BF16: the same element count, which "
                                  "our memory model also prices BF16-sized" if model.fp8_param else "BF16 either way")))
        if model.fp8_param:
            out.append(BuildChange("model.fp8_param", True, False, "see model.fp8"))
    if local and model.cuda_graph_impl not in (None, "none"):
        out.append(BuildChange("model.cuda_graph_impl", model.cuda_graph_impl, "none", "CUDA graphs are captured at "
                               "run time by Transformer Engine; they hold no weight"))
    return out


def _flex_backend_installed(backend: str | None) -> bool:
    import importlib.util

    module = {"deepep": "deep_ep", "hybridep": "deep_ep"}.get(backend or "deepep", "deep_ep")
    return importlib.util.find_spec(module) is not None


def _apply(target, changes: list[BuildChange]) -> None:
    for change in changes:
        owner = target
        *path, leaf = change.field.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, leaf, change.new)


@contextlib.contextmanager
def _fake_world(world_size: int, rank: int):
    """torch.distributed's fake backend as rank ``rank`` of ``world_size``; torn down (megatron-core's process groups
    too) on exit."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise LcmoeError("torch.distributed is already initialised in this process, so the build cannot stand up "
                         "its own fake world", "run the build in a process of its own (python -m lcmoe_recipes.check "
                         "CONFIG --build)")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _process_groups(trial):
    """megatron-core's process groups for the current (fake) rank, by megatron-bridge's own initialisation."""
    from megatron.bridge.training import initialize
    from megatron.bridge.training.setup import _resolve_embedding_ranks_fn

    return initialize._initialize_distributed(
        model_config=trial.model, dist_config=trial.dist,
        num_distributed_optimizer_instances=trial.ddp.num_distributed_optimizer_instances,
        get_embedding_ranks=_resolve_embedding_ranks_fn(trial.model, None), get_position_embedding_ranks=None)


def _coordinates() -> dict[str, int]:
    from megatron.core import parallel_state as ps

    return {"pp": ps.get_pipeline_model_parallel_rank(), "tp": ps.get_tensor_model_parallel_rank(),
            "cp": ps.get_context_parallel_rank(), "ep": ps.get_expert_model_parallel_rank(),
            "etp": ps.get_expert_tensor_parallel_rank(), "dp": ps.get_data_parallel_rank(),
            "edp": ps.get_expert_data_parallel_rank()}


def _build_one(trial, world_size: int, rank: int, substitutions: list):
    """(coordinates, chunks, DDP buffer bytes, parameter signature) of global rank ``rank``."""
    from megatron.core.utils import unwrap_model

    model_cfg = copy.deepcopy(trial.model)
    ddp_cfg = copy.deepcopy(trial.ddp)
    with _fake_world(world_size, rank), contextlib.redirect_stdout(io.StringIO()):
        pgc = _process_groups(trial)
        coords = _coordinates()
        with subs.installed(substitutions):
            model = model_cfg.provide_distributed_model(
                ddp_config=ddp_cfg, use_megatron_fsdp=trial.dist.use_megatron_fsdp,
                use_torch_fsdp2=trial.dist.use_torch_fsdp2,
                overlap_param_gather_with_optimizer_step=trial.optimizer.overlap_param_gather_with_optimizer_step,
                data_parallel_random_init=trial.rng.data_parallel_random_init, pg_collection=pgc,
                use_cpu_initialization=True, init_model_with_meta_device=True)
        chunks, signature = [], []
        grad = padding = param = 0
        for vp, chunk in enumerate(model):
            dense = expert = 0
            for name, p in chunk.named_parameters():
                size = p.numel() * p.element_size()
                if getattr(p, "allreduce", True):
                    dense += size
                else:
                    expert += size
                signature.append((vp, name, tuple(p.shape), str(p.dtype)))
            inner = unwrap_model(chunk)
            decoder = len(inner.decoder.layers) if getattr(inner, "decoder", None) is not None else 0
            mtp = len(inner.mtp.layers) if getattr(inner, "mtp", None) is not None else 0
            chunks.append(ChunkBuild(vp, decoder, mtp, dense, expert))
            for buffer in list(getattr(chunk, "buffers", ())) + list(getattr(chunk, "expert_parallel_buffers", ())):
                element = buffer.grad_data.element_size()
                grad += buffer.grad_data.numel() * element
                padding += (buffer.numel - buffer.numel_unpadded) * element
                if getattr(buffer, "param_data", None) is not None:
                    param += buffer.param_data.numel() * buffer.param_data.element_size()
        del model
    return coords, tuple(chunks), (grad, padding, param), tuple(signature)


def _upstream_line(exc: BaseException) -> str:
    """The deepest frame of ``exc`` inside megatron (relative path:line), else the deepest frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    upstream = [f for f in frames if "/megatron/" in f.filename] or frames
    if not upstream:
        return "unknown location"
    frame = upstream[-1]
    path = frame.filename
    cut = path.rfind("/megatron/")
    return f"{path[cut + 1:] if cut >= 0 else Path(path).name}:{frame.lineno} ({frame.name})"


def _failure_text(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message} [at {_upstream_line(exc)}]"


def _stage_failures(failures: dict[str, list[tuple[int, int]]]) -> list[Finding]:
    """One error finding per distinct failure: the stages (and global ranks) it stopped, upstream file:line."""
    out = []
    for text, where in failures.items():
        stages = ", ".join(f"{pp} (global rank {rank})" for pp, rank in where)
        out.append(Finding("error", BUILD_RULE, f"pipeline stage{'s' if len(where) > 1 else ''} {stages} "
                           f"do{'' if len(where) > 1 else 'es'} not build: {text}",
                           "megatron-core would fail the same way when the job starts: change the setting the message "
                           "names (python -m lcmoe_recipes.check CONFIG lists the config's other findings), or report "
                           "it with this line if the config is valid"))
    return out


def _predicted(plan, pp_rank: int) -> dict:
    from ..cost.memory import rank_memory

    memory = rank_memory(plan, pp_rank)
    lay = plan.layout
    stages = stage_decoder_layers(plan)
    vpp = lay.vpp or 1
    last = pp_rank == lay.pp - 1
    return {"predicted_dense_bytes": memory.detail["dense_params"] * 2,
            "predicted_expert_bytes": memory.detail["expert_params"] * 2,
            "predicted_gradient_bytes": memory.gradients,
            "predicted_decoder_layers": tuple(stages[v * lay.pp + pp_rank] for v in range(vpp)),
            "predicted_mtp_layers": plan.mtp_num_layers if last else 0}


def build_ranks(cfg, hardware: str | Hardware, world_size: int, name: str = "config",
                pp_ranks: list[int] | None = None) -> BuildReport:
    """Build every pipeline stage of ``cfg`` at ``world_size`` ranks of ``hardware`` (see the module doc).

    Args:
        cfg: a megatron-bridge ConfigContainer (not changed: the build works on a deep copy).
        hardware, world_size: the target the config was planned and validated for.
        name: shown in the report.
        pp_ranks: the pipeline ranks to build (default: every one).

    Returns:
        :class:`BuildReport`. A stage that does not build, a config that does not validate, or a stand-in that no
        longer matches the installed upstream code is an error finding (stage, upstream file:line, fix), never an
        exception; a model with a part only Transformer Engine builds, where TE is absent, is "not built".

    Raises:
        LcmoeError: torch.distributed is already initialised in this process.
    """
    from ..emit.config import plan_from_config

    start = time.monotonic()
    hw = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    load_bridge(quiet=True)
    plan = plan_from_config(cfg, hw, world_size, name)
    local = not te_installed()
    impl = "local" if local else "transformer_engine"
    report = dict(name=name, hardware=hw.key, world_size=world_size, implementation=impl)
    if local and getattr(cfg.model, "experimental_attention_variant", None):
        return BuildReport(**report, not_built=(
            f"needs Transformer Engine: megatron-core 0.19.2 builds '{cfg.model.experimental_attention_variant}' "
            "layers only with TE (experimental_attention_variant_module_specs._get_backend_spec_provider)"),
            findings=(Finding("warning", "build/needs-te", f"{name} was not built: its "
                              f"{cfg.model.experimental_attention_variant} layers need Transformer Engine",
                              "run the build where TE is installed (scripts/setup.sh --with-te, or the cluster "
                              "container)"),), seconds=time.monotonic() - start)

    from megatron.bridge.training.config import runtime_config_update

    trial = copy.deepcopy(cfg)
    changes = _changes_before_validation(trial)
    _apply(trial, changes)
    try:
        with target_environment(hw, world_size, cluster_paths=[trial.checkpoint.pretrained_checkpoint]), \
                quiet_upstream():
            runtime_config_update(trial)
    except Exception as exc:  # upstream validation: the check reports it with its rule; here it stops the build
        return BuildReport(**report, changes=tuple(map(str, changes)), findings=(Finding(
            "error", "build/validate", f"{name} does not validate for {world_size} x {hw.key}, so it was not built: "
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
            "python -m lcmoe_recipes.check CONFIG names the rule and the fix"),), seconds=time.monotonic() - start)
    after = _changes_after_validation(trial.model, local)
    _apply(trial, after)
    changes += after
    notes = [str(c) for c in changes] + ([f"model.{line} (megatron-core's local modules: Transformer Engine is not "
                                           "installed; the same weights)" for line in switch_to_local(trial.model)]
                                         if local else [])
    needed = subs.needed(trial.model, local)
    problems = subs.mismatches(needed)
    if problems:
        return BuildReport(**report, changes=tuple(notes), substitutions=tuple(needed), findings=tuple(
            Finding("error", "build/stand-in", f"a build-only stand-in no longer matches the installed upstream code: "
                    f"{p}", "the build was written for megatron-core 0.19.2 / megatron-bridge 0.6.2: install those, "
                    "or update lcmoe_recipes.emit.build_substitutions") for p in problems),
            seconds=time.monotonic() - start)

    lay = plan.layout
    per_stage = world_size // lay.pp
    stages, failures = [], {}
    with quiet_upstream():
        for pp_rank in (pp_ranks if pp_ranks is not None else range(lay.pp)):
            t0 = time.monotonic()
            first, corner = pp_rank * per_stage, (pp_rank + 1) * per_stage - 1
            try:
                coords, chunks, (grad, padding, param), signature = _build_one(trial, world_size, first, needed)
                classes = 1
                if corner != first:
                    if _build_one(trial, world_size, corner, needed)[3] != signature:
                        classes = 2
            except LcmoeError:
                raise
            except Exception as exc:  # noqa: BLE001 -- every upstream failure becomes a finding
                failures.setdefault(_failure_text(exc), []).append((pp_rank, first))
                continue
            stages.append(StageBuild(pp_rank=pp_rank, global_rank=first, coordinates=coords, chunks=chunks,
                                     grad_buffer_bytes=grad, grad_padding_bytes=padding, param_buffer_bytes=param,
                                     coordinate_classes=classes, seconds=time.monotonic() - t0,
                                     **_predicted(plan, pp_rank)))
    findings = _stage_failures(failures)
    for s in stages:
        if s.coordinate_classes > 1:
            findings.append(Finding("warning", "build/coordinates", f"pipeline stage {s.pp_rank}: the last TP/CP/EP/DP "
                                    "rank of the stage builds other parameter shapes than rank 0 of it; the table shows "
                                    "rank 0", "build that rank with pp_ranks and compare"))
    return BuildReport(**report, stages=tuple(stages), changes=tuple(notes), substitutions=tuple(needed),
                       findings=tuple(findings), seconds=time.monotonic() - start)
