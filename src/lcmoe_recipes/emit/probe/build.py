"""Build the real megatron-core model of every pipeline stage of a config, at its full world size, on a CPU.

``build_ranks(cfg, hardware, world_size)`` stands up the config's whole world in this one process on
torch.distributed's ``fake`` backend (as Megatron-LM's ``--fake-process-group``), creates megatron-core's process
groups with megatron-bridge 0.6.2's own ``_initialize_distributed`` (what ``initialize_megatron`` calls), and, for
each pipeline rank, builds the model the run builds -- every virtual-pipeline chunk -- through the config's own
provider (``provide_distributed_model``: megatron-bridge's ``get_model`` with ``use_cpu_initialization=True,
init_model_with_meta_device=True``), wrapped in megatron-core's ``DistributedDataParallel`` with the config's DDP
settings, as ``training/setup.py`` (``_build_distributed_model``) wraps it. Weights and DDP buffers live on the meta
device: no GPU and no real memory. What it counts, per stage: dense and expert parameter bytes (expert = the
parameters of every ``MoELayer.experts``, the routed experts), gradient-buffer bytes (and the buckets' padding),
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
:mod:`lcmoe_recipes.emit.probe.substitutions`. Both lists are part of the report.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import re
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from ...catalog import Hardware, get_hardware
from ...checks import Finding
from ...core.pipeline import stage_decoder_layers
from ...cost.shapes import shapes
from ...errors import LcmoeError
from ..local_impl import switch_to_local
from ..stack import load_bridge, quiet_upstream, te_installed
from ..target import target_environment
from . import substitutions as subs
from .fake_world import fake_world

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
        grad_padding_bytes: the part of ``grad_buffer_bytes`` between and after the parameters: with the distributed
            optimizer each parameter starts at a multiple of 64 elements and each bucket ends at a multiple of
            lcm(DP, 128) (megatron-core 0.19.2 ``optimizer/param_layout.py:26`` / ``:33``); the parameter buffer
            has the same layout.
        param_buffer_bytes: DDP's parameter buffers (the distributed optimizer's; the parameters are views of them).
        predicted_dense_bytes, predicted_expert_bytes, predicted_gradient_bytes: our memory model, same stage.
        predicted_decoder_layers, predicted_mtp_layers: our pipeline split, per chunk.
        explained: (component, reason, bytes) for each known difference between what was built here and what the
            run builds, included in ``residuals``' raw difference and taken out of it.
        coordinate_classes: 1 when the far-corner rank of the stage built the same shapes, else 2.
        seconds: build time of this stage (both ranks).
        built_as: None when built; else the pipeline rank with the same modules it is reported from
            (``build_ranks(distinct_only=True)``).
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
    explained: tuple[tuple[str, str, float], ...] = ()
    coordinate_classes: int = 1
    seconds: float = 0.0
    built_as: int | None = None

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
        """Configured minus predicted, bytes, less the :attr:`explained` differences: dense and expert parameters, and
        gradients (bucket padding excluded)."""
        known = {key: sum(b for k, _, b in self.explained if k == key) for key in ("dense", "expert", "gradients")}
        return {"dense": self.dense_bytes - self.predicted_dense_bytes - known["dense"],
                "expert": self.expert_bytes - self.predicted_expert_bytes - known["expert"],
                "gradients": self.grad_buffer_bytes - self.grad_padding_bytes - self.predicted_gradient_bytes
                - known["gradients"]}


@dataclass(frozen=True)
class BuildReport:
    """What :func:`build_ranks` built.

    Attributes:
        name, hardware, world_size: the config and its target.
        implementation: "transformer_engine" (TE installed: TE's modules) or "local" (megatron-core's own modules).
        stages: one per pipeline rank built (empty when nothing was built).
        changes: the build copy's fields that differ from the config.
        substitutions: the build-only stand-ins used (:class:`lcmoe_recipes.emit.probe.substitutions.Substitution`).
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
                    f"{_gib(s.grad_buffer_bytes)} ({_gib(s.predicted_gradient_bytes)})  {s.coordinate_classes:>3}"
                    + (f"  (the modules of PP {s.built_as}: not built again)" if s.built_as is not None else ""))
            worst = max((abs(v) for s in self.stages for v in s.residuals.values()), default=0)
            where = "" if self.ok else f" on the {len(self.stages)} stage(s) built"
            lines.append(f"  parameters and gradients (less bucket padding) equal our memory model's{where}, byte for "
                         "byte" + (" once the differences below are taken out" if any(s.explained for s in self.stages)
                                   else "")
                         if worst == 0 else f"  largest unexplained difference from our memory model{where}: "
                         f"{worst:,.0f} bytes")
            for reason in sorted({r for s in self.stages for _, r, _ in s.explained}):
                total = {k: sum(b for s in self.stages for k2, r, b in s.explained if r == reason and k2 == k)
                         for k in ("dense", "gradients")}
                lines.append(f"  known difference ({reason}): {total['dense']:+,.0f} parameter bytes, "
                             f"{total['gradients']:+,.0f} gradient bytes over the stages built")
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
    if model.perform_initialization:
        out.append(BuildChange("model.perform_initialization", True, False, "the build counts shapes and dtypes: no "
                               "weight is drawn (on the meta device there are no values to draw)"))
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
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.utils import unwrap_model

    model_cfg = copy.deepcopy(trial.model)
    ddp_cfg = copy.deepcopy(trial.ddp)
    with fake_world(world_size, rank), contextlib.redirect_stdout(io.StringIO()):
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
        grad = padding = param = mla_down = 0
        for vp, chunk in enumerate(model):
            inner = unwrap_model(chunk)
            routed = {id(p) for m in inner.modules() if isinstance(m, MoELayer) for p in m.experts.parameters()}
            dense = expert = 0
            for name, p in chunk.named_parameters():
                size = p.numel() * p.element_size()
                if id(p) in routed:
                    expert += size
                else:
                    dense += size
                signature.append((vp, name, tuple(p.shape), str(p.dtype)))
                if ".linear_q_down_proj." in name or ".linear_kv_down_proj." in name:
                    mla_down += size
            decoder = len(inner.decoder.layers) if getattr(inner, "decoder", None) is not None else 0
            mtp = len(inner.mtp.layers) if getattr(inner, "mtp", None) is not None else 0
            chunks.append(ChunkBuild(vp, decoder, mtp, dense, expert))
            for buffer in list(getattr(chunk, "buffers", ())) + list(getattr(chunk, "expert_parallel_buffers", ())):
                element = buffer.grad_data.element_size()
                grad += buffer.grad_data.numel() * element
                padding += (buffer.numel - sum(p.numel() for p in buffer.params)) * element
                if getattr(buffer, "param_data", None) is not None:
                    param += buffer.param_data.numel() * buffer.param_data.element_size()
        grad_element = model[0].buffers[0].grad_data.element_size() if getattr(model[0], "buffers", None) else 0
        del model
    return coords, tuple(chunks), (grad, padding, param), tuple(signature), (mla_down, grad_element)


def _upstream_line(exc: BaseException) -> str:
    """The deepest frame of ``exc`` inside megatron (relative path:line (function)), and the frame that called it when
    that one is a generic helper (``megatron/core/utils.py``: ``ensure_divisibility`` and the like)."""
    frames = traceback.extract_tb(exc.__traceback__)
    upstream = [f for f in frames if "/megatron/" in f.filename] or frames
    if not upstream:
        return "unknown location"

    def where(frame) -> str:
        cut = frame.filename.rfind("/megatron/")
        return f"{frame.filename[cut + 1:] if cut >= 0 else Path(frame.filename).name}:{frame.lineno} ({frame.name})"

    text = where(upstream[-1])
    callers = [f for f in upstream if not f.filename.endswith("megatron/core/utils.py")]
    if upstream[-1].filename.endswith("megatron/core/utils.py") and callers:
        text += f", called from {where(callers[-1])}"
    return text


def _te_frame(exc: BaseException) -> str | None:
    """Where ``exc`` shows that the model needs Transformer Engine: the first frame asking for a TE module (a TE
    layer-spec function, or TE's extension module), or the upstream line of a message that says TE is required, as
    'path:line (function)'; None otherwise."""
    for frame in traceback.extract_tb(exc.__traceback__):
        if "transformer_engine" in frame.name or frame.filename.endswith("extensions/transformer_engine.py"):
            cut = frame.filename.rfind("/megatron/")
            return f"{frame.filename[cut + 1:] if cut >= 0 else frame.filename}:{frame.lineno} ({frame.name})"
    # (a "fused norm+linear" is TE's LayerNormLinear: megatron-core has no local one)
    if re.search(r"requires? TransformerEngine|requires? Transformer Engine|install TE|use a fused norm\+linear",
                 str(exc)):
        return f"{_upstream_line(exc)}: {str(exc).strip().splitlines()[0]}"
    return None


def _failure_text(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message} [at {_upstream_line(exc)}]"


# What to change for a construction failure, by upstream message (data; first match wins, else BUILD_FIX).
BUILD_FIXES = (
    (r"(\d+) is not divisible by (\d+)", "a dimension ({0}) must split evenly over a parallel group of {1} ranks (the "
     "frame named says which): change that model dimension -- for the vocabulary, pad model.vocab_size to a multiple "
     "of {1} (megatron-bridge pads it to make_vocab_size_divisible_by x TP when should_pad_vocab is true) -- or the "
     "parallel size"),
)
BUILD_FIX = ("megatron-core fails the same way when the job starts: change the setting the message names (python -m "
             "lcmoe_recipes.check CONFIG lists the config's other findings)")


def _stage_failures(failures: dict[str, list[tuple[int, int]]]) -> list[Finding]:
    """One error finding per distinct failure: the stages (and global ranks) it stopped, upstream file:line, fix."""
    out = []
    for text, where in failures.items():
        stages = ", ".join(f"{pp} (global rank {rank})" for pp, rank in where)
        fix = next((fix.format(*m.groups()) for pattern, fix in BUILD_FIXES if (m := re.search(pattern, text))),
                   BUILD_FIX)
        out.append(Finding("error", BUILD_RULE, f"pipeline stage{'s' if len(where) > 1 else ''} {stages} "
                           f"do{'' if len(where) > 1 else 'es'} not build: {text}", fix))
    return out


LOCAL_MLA_DOWN = ("megatron-core's local MLA spec splits the q/kv down projections over TP (ColumnParallelLinear); "
                  "Transformer Engine's, which the run builds, keeps them whole (TELinear 'duplicated': "
                  "multi_latent_attention.py:525, :572)")


def _local_mla_down(built_bytes: int, grad_element: int, tp: int) -> tuple[tuple[str, str, float], ...]:
    """The local build's MLA down projections (``built_bytes``, bf16) hold 1/TP of the run's: (TP - 1) times as many
    bytes are missing, and their gradients (``grad_element`` bytes each)."""
    if not built_bytes or tp == 1:
        return ()
    missing = built_bytes * (tp - 1)
    return (("dense", LOCAL_MLA_DOWN, -float(missing)),
            ("gradients", LOCAL_MLA_DOWN, -float(missing // 2 * grad_element)))


def _predicted(plan, pp_rank: int) -> dict:
    from ...cost.memory import rank_memory

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


def _needs_te(report: dict, cfg, name: str, why: str, notes, needed, start: float) -> BuildReport:
    """The report of a model only Transformer Engine builds, where TE is absent: not built, with the reason."""
    spec = cfg.model.transformer_layer_spec
    spec_name = f"{getattr(spec, '__module__', '')}.{getattr(spec, '__qualname__', type(spec).__name__)}"
    return BuildReport(**report, changes=tuple(notes), substitutions=tuple(needed), not_built=(
        f"needs Transformer Engine: {why}"), findings=(Finding(
            "warning", "build/needs-te", f"{name} was not built here: {why} (layer spec {spec_name})",
            "run the build where Transformer Engine is installed (scripts/setup.sh --with-te, or the cluster "
            "container)"),), seconds=time.monotonic() - start)


def _stage_key(plan, pp_rank: int) -> tuple:
    """What decides the modules of pipeline rank ``pp_rank``: per chunk, its layers' kinds (MoE or dense, attention
    kind) and whether it holds the embedding, the final norm, the MTP layers and the loss."""
    s = shapes(plan.model_spec)
    stages = stage_decoder_layers(plan)
    starts = [sum(stages[:i]) for i in range(len(stages))]
    final = max(i for i, n in enumerate(stages) if n) if plan.mtp_num_layers else len(stages) - 1
    chunks = [pp_rank + v * plan.layout.pp for v in range(plan.layout.vpp or 1)]
    return tuple((tuple((s.is_moe(i), s.kind(i)) for i in range(starts[c], starts[c] + stages[c])), c == 0,
                  c == len(stages) - 1, c == final) for c in chunks)


def _build_stages(trial, plan, world_size: int, needed: list, local: bool, pp_ranks, distinct_only: bool):
    """(stages, failures by message, the TE frame when the layer spec needs Transformer Engine) of the build."""
    lay = plan.layout
    per_stage = world_size // lay.pp
    stages, failures, built = [], {}, {}
    with quiet_upstream():
        for pp_rank in (pp_ranks if pp_ranks is not None else range(lay.pp)):
            key = _stage_key(plan, pp_rank)
            if distinct_only and key in built:
                twin = built[key]
                stages.append(dataclasses.replace(twin, pp_rank=pp_rank, global_rank=pp_rank * per_stage,
                                                  coordinates={**twin.coordinates, "pp": pp_rank}, built_as=twin.pp_rank,
                                                  seconds=0.0, **_predicted(plan, pp_rank)))
                continue
            t0 = time.monotonic()
            first, corner = pp_rank * per_stage, (pp_rank + 1) * per_stage - 1
            try:
                coords, chunks, (grad, padding, param), signature, (mla_down, grad_element) = _build_one(
                    trial, world_size, first, needed)
                classes = 1
                if corner != first and _build_one(trial, world_size, corner, needed)[3] != signature:
                    classes = 2
            except LcmoeError:
                raise
            except Exception as exc:  # noqa: BLE001 -- every upstream failure becomes a finding
                if local and (frame := _te_frame(exc)):
                    return [], {}, frame
                failures.setdefault(_failure_text(exc), []).append((pp_rank, first))
                continue
            explained = _local_mla_down(mla_down, grad_element, lay.tp) if local else ()
            built[key] = StageBuild(pp_rank=pp_rank, global_rank=first, coordinates=coords, chunks=chunks,
                                    grad_buffer_bytes=grad, grad_padding_bytes=padding, param_buffer_bytes=param,
                                    explained=explained, coordinate_classes=classes, seconds=time.monotonic() - t0,
                                    **_predicted(plan, pp_rank))
            stages.append(built[key])
    return stages, failures, None


def build_ranks(cfg, hardware: str | Hardware, world_size: int, name: str = "config",
                pp_ranks: list[int] | None = None, distinct_only: bool = False) -> BuildReport:
    """Build every pipeline stage of ``cfg`` at ``world_size`` ranks of ``hardware`` (see the module doc).

    Args:
        cfg: a megatron-bridge ConfigContainer (not changed: the build works on a deep copy).
        hardware, world_size: the target the config was planned and validated for.
        name: shown in the report.
        pp_ranks: the pipeline ranks to build (default: every one).
        distinct_only: build one pipeline rank per distinct set of modules (its chunks' layer kinds, embedding,
            final norm, MTP, loss) and report the others from it (``StageBuild.built_as``); the tests use it.

    Returns:
        :class:`BuildReport`. A stage that does not build, a config that does not validate, or a stand-in that no
        longer matches the installed upstream code is an error finding (stage, upstream file:line, fix), never an
        exception; a model with a part only Transformer Engine builds, where TE is absent, is "not built".

    Raises:
        LcmoeError: torch.distributed is already initialised in this process.
    """
    from ..readback import plan_from_config

    start = time.monotonic()
    hw = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    load_bridge(quiet=True)
    plan = plan_from_config(cfg, hw, world_size, name)
    local = not te_installed()
    impl = "local" if local else "transformer_engine"
    report = dict(name=name, hardware=hw.key, world_size=world_size, implementation=impl)
    if local and getattr(cfg.model, "experimental_attention_variant", None):
        return _needs_te(report, cfg, name, f"megatron-core 0.19.2 builds its '{cfg.model.experimental_attention_variant}'"
                         " layers only with TE (experimental_attention_variant_module_specs._get_backend_spec_provider)",
                         (), (), start)

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
                    "or update lcmoe_recipes.emit.probe.substitutions") for p in problems),
            seconds=time.monotonic() - start)

    stages, failures, te = _build_stages(trial, plan, world_size, needed, local, pp_ranks, distinct_only)
    if te:
        return _needs_te(report, cfg, name, f"its layer spec asks for Transformer Engine modules at {te}", notes,
                         needed, start)
    findings = _stage_failures(failures)
    for s in stages:
        if s.coordinate_classes > 1:
            findings.append(Finding("warning", "build/coordinates", f"pipeline stage {s.pp_rank}: the last TP/CP/EP/DP "
                                    "rank of the stage builds other parameter shapes than rank 0 of it; the table shows "
                                    "rank 0", "build that rank with pp_ranks and compare"))
    return BuildReport(**report, stages=tuple(stages), changes=tuple(notes), substitutions=tuple(needed),
                       findings=tuple(findings), seconds=time.monotonic() - start)
