"""What megatron really runs for a ConfigContainer, constructed on the CPU and read back beside what the YAML says.

:func:`effective_settings` builds, on a copy of the config, what megatron-bridge 0.6.2 / megatron-core 0.19.2 build
from it, and reads the values that run:

* **the resolved config** -- megatron-bridge's ``runtime_config_update`` (mixed-precision resolution, comm-overlap
  setup, the provider's ``finalize`` and ``TransformerConfig.__post_init__``) inside
  :func:`lcmoe_recipes.emit.target.target_environment`, as :func:`lcmoe_recipes.emit.validate.config_findings` runs
  it (:func:`lcmoe_recipes.emit.target.resolve_for_target`): the gradient buffer dtype
  (``ddp.grad_reduce_in_fp32`` after the mixed-precision recipe overwrote it) and the CUDA-graph scope;
* **rope fusion** -- megatron-bridge's ``utils/fusions.py`` ``validate_rope_fusion_compatibility``, which
  ``GPTModelProvider.provide`` (``models/gpt_provider.py``) calls to turn ``apply_rope_fusion`` off, e.g. for
  ``position_embedding_type='yarn'``;
* **one layer of each layer kind** (dense or MoE) -- megatron-core's ``TransformerLayer`` built with the resolved
  config, on the meta device, under a one-rank fake world; its ``recompute_input_layernorm`` and
  ``recompute_pre_mlp_layernorm`` flags read back (``transformer/transformer_layer.py``, ``__init__``: the pre-MLP
  norm recompute is switched off, with a logged warning, for a MoE layer whose ``moe_router`` is TE-graphed unless
  ``moe_preprocess`` is graphed with the alltoall dispatcher, and never with shared-expert overlap);
* **the optimizer** -- megatron-core's own selection (``optimizer/__init__.py``,
  ``_get_megatron_optimizer_based_on_param_groups``: ``HybridDeviceOptimizer`` under ``optimizer_cpu_offload``, built
  without ``exp_avg_dtype`` and with ``param_update_in_fp32=True``) on a two-parameter BF16 proxy, stepped once; the
  dtype and place of its Adam moments read from its state;
* **the scheduler** -- megatron-core's ``OptimizerParamScheduler`` with the arguments megatron-bridge's
  ``training/optim.py`` (``_get_scheduler``) gives it, stepped once: the weight decay applied at step 1
  (``start_weight_decay`` / ``end_weight_decay`` replace ``optimizer.weight_decay``);
* **the dataset config's finalize** -- megatron-core ``datasets/blended_megatron_dataset_config.py``: no ``blend``
  means mock data, whatever ``mock`` says.

Every log record and Python warning megatron emits on the way is kept (:attr:`EffectiveSettings.logs`).

Stand-ins (each listed in :attr:`EffectiveSettings.stand_ins`; none changes a value read back):

* without Transformer Engine, the layer's norms are those of megatron-core's TE layer spec
  (``models/gpt/gpt_layer_specs.py`` ``get_gpt_layer_with_transformer_engine_submodules``,
  ``models/gpt/experimental_attention_variant_module_specs.py``): the input norm is fused into TE's QKV linear
  (``TELayerNormColumnParallelLinear``: an ``IdentityOp`` in the layer, so nothing to recompute) except for MLA, whose
  down projections take a separate norm; the pre-MLP norm is a separate norm in MoE layers and fused into the dense
  MLP's first linear layer otherwise. The attention block, which holds none of the flags read, is an ``IdentityOp``;
* the MoE block is built with one expert-parallel rank and the alltoall dispatcher where the flex backend
  (DeepEP / HybridEP) is not installed; the layer keeps the config's dispatcher, which is what its flags read;
* the proxy optimizer is built without the distributed optimizer (which shards the same inner optimizer's state and
  keeps its dtypes), its wrapper (``Float16OptimizerWithFloat16Params`` / ``DistributedOptimizer``, which allocate
  CUDA tensors) left out, CUDA streams answered on the CPU; without TE, the precision-aware optimizer's FusedAdam is
  torch's AdamW holding its moments in ``exp_avg_dtype`` as TE's FusedAdam does
  (``transformer_engine/pytorch/optimizers/fused_adam.py``).

Megatron-core's local modules need none of TE, so this runs in the light environment; it needs a process where
torch.distributed is not initialised (:func:`lcmoe_recipes.emit.probe.fake_world.fake_world`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

from ..catalog import Hardware, get_hardware
from ..checks import Finding

MCORE = "megatron-core 0.19.2"
BRIDGE = "megatron-bridge 0.6.2"
RULE = "effective"
HEADING = "effective settings (read back from megatron)"


@dataclass(frozen=True)
class Effective:
    """One value megatron derives from a config: what the config states and what runs.

    Attributes:
        key: the setting, e.g. ``rope_fusion`` or ``layer[moe].recompute_pre_mlp_layernorm``.
        stated: what the config says (in the config's own terms).
        runs: what megatron constructed.
        source: the upstream file and function that derived ``runs``.
        fix: the config change that states what runs (empty when they agree).
    """

    key: str
    stated: Any
    runs: Any
    source: str
    fix: str = ""

    @property
    def differs(self) -> bool:
        return self.stated != self.runs

    def as_dict(self) -> dict:
        return {"key": self.key, "stated": _plain(self.stated), "runs": _plain(self.runs), "source": self.source,
                "differs": self.differs, **({"fix": self.fix} if self.differs else {})}


@dataclass(frozen=True)
class EffectiveSettings:
    """What :func:`effective_settings` read back.

    Attributes:
        values: every effective value, stated beside what runs.
        logs: the warnings megatron logged or raised while constructing them ("logger: message").
        stand_ins: what the CPU construction stood in for (module doc).
    """

    values: tuple[Effective, ...]
    logs: tuple[str, ...] = ()
    stand_ins: tuple[str, ...] = ()

    @property
    def differences(self) -> tuple[Effective, ...]:
        return tuple(v for v in self.values if v.differs)

    def get(self, key: str) -> Effective:
        """The value of ``key``.

        Raises:
            KeyError: no such value.
        """
        for value in self.values:
            if value.key == key:
                return value
        raise KeyError(key)

    def findings(self, own: bool) -> list[Finding]:
        """One finding per difference (rule ``effective/<key>``): an error for our own recipes and planner output
        (``own``: they must state what runs), else a warning naming the fix."""
        severity = "error" if own else "warning"
        return [Finding(severity, f"{RULE}/{v.key}", f"the config states {v.key}={_plain(v.stated)!r} but megatron "
                        f"runs {_plain(v.runs)!r} ({v.source})", v.fix) for v in self.differences]

    def as_dict(self) -> dict:
        return {"values": [v.as_dict() for v in self.values], "logs": list(self.logs),
                "stand_ins": list(self.stand_ins)}

    def lines(self) -> list[str]:
        """One line per value: ``key: runs (stated ...) <- source``."""
        out = []
        for v in self.values:
            said = f" (the config says {_plain(v.stated)!r})" if v.differs else ""
            out.append(f"{v.key}: {_plain(v.runs)!r}{said} <- {v.source}")
        return out

    def section(self) -> str:
        """The ``--explain`` section: a heading ("effective settings (read back from megatron)"), every value
        (:meth:`lines`), the warnings megatron logged while constructing them and the CPU stand-ins used."""
        out = [f"{HEADING}:"] + [f"  {line}" for line in self.lines()]
        out += ["  megatron logged:"] + ([f"    {line}" for line in self.logs] or ["    nothing at WARNING or above"])
        out += ["  stand-ins (the CPU construction; none changes a value read back):"]
        out += [f"    {line}" for line in self.stand_ins] or ["    none"]
        return "\n".join(out)


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    return str(value).removeprefix("torch.")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def capture(lines: list[str]) -> Iterator[None]:
    """Every WARNING-or-worse log record and every Python warning raised in the block, appended to ``lines``; while
    it runs, the root logger's own handlers are set aside and INFO records dropped, so nothing megatron logs reaches
    the command's output (``--json`` prints one JSON document)."""
    handler = _Records()
    root = logging.getLogger()
    previous, handlers = logging.root.manager.disable, list(root.handlers)
    # a job's setup_logging (megatron-bridge training/utils/log_utils.py) may have left a filter that drops WARNING
    # records, or a higher level, on the loggers of this process: set aside for the block, so what megatron warns is
    # read whatever ran before
    loggers = [root] + [lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    saved = [(lg, list(lg.filters), lg.level, lg.disabled) for lg in loggers]
    for lg, _, level, _ in saved:
        lg.filters, lg.disabled = [], False
        if level > logging.WARNING:
            lg.setLevel(logging.WARNING)
    logging.disable(logging.INFO)
    root.handlers = [handler]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        root.handlers = handlers
        for lg, filters, level, disabled in saved:
            lg.filters, lg.disabled = filters, disabled
            lg.setLevel(level)
        logging.disable(previous)
    lines += handler.lines + [f"warning ({w.category.__name__}): {w.message}" for w in caught]


# --- the values ------------------------------------------------------------------------------------------------------
def _rope_fusion(before, model) -> Effective:
    from megatron.bridge.utils import fusions

    trial = copy.copy(model)
    runs = bool(trial.apply_rope_fusion) and fusions.validate_rope_fusion_compatibility(trial)
    stated = bool(before.model.apply_rope_fusion)
    return Effective("rope_fusion", stated, runs, f"{BRIDGE} models/gpt_provider.py GPTModelProvider.provide -> "
                     "utils/fusions.py validate_rope_fusion_compatibility",
                     f"set model.apply_rope_fusion={str(runs).lower()}")


def _grad_buffer(before, after) -> Effective:
    stated = "fp32" if before.ddp.grad_reduce_in_fp32 else "bf16"
    runs = "fp32" if after.ddp.grad_reduce_in_fp32 else "bf16"
    return Effective("grad_buffer_dtype", stated, runs, f"{BRIDGE} training/mixed_precision.py "
                     "update_config_with_precision_overrides (the mixed-precision recipe's grad_reduce_in_fp32 "
                     "overwrites ddp's)", f"set ddp.grad_reduce_in_fp32={str(runs == 'fp32').lower()} and the same "
                     "on mixed_precision")


def _graph_names(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [] if value == "full" else [value]
    return sorted(getattr(v, "name", str(v)) for v in value)


def _cuda_graphs(before, after) -> Effective:
    b, a = before.model, after.model
    stated_modules = b.cuda_graph_modules if b.cuda_graph_scope is None else b.cuda_graph_scope
    stated = ((b.cuda_graph_impl or "none"), _graph_names(stated_modules))
    runs = ((a.cuda_graph_impl or "none"), _graph_names(a.cuda_graph_modules))
    return Effective("cuda_graphs", list(stated), list(runs), f"{MCORE} transformer/transformer_config.py "
                     "TransformerConfig.__post_init__ (cuda_graph_impl, cuda_graph_modules; [] = the whole layer)",
                     f"set model.cuda_graph_impl={runs[0]} model.cuda_graph_modules={runs[1]}")


def _data(before, lines: list[str]) -> Effective:
    data = copy.deepcopy(before.dataset)
    stated = "mock" if getattr(data, "mock", False) else "real"
    with capture(lines):
        if hasattr(data, "finalize"):
            data.finalize()
    runs = "mock" if getattr(data, "mock", False) else "real"
    return Effective("data", stated, runs, f"{MCORE} datasets/blended_megatron_dataset_config.py "
                     "BlendedMegatronDatasetConfig.__post_init__ (no blend: mock = True)",
                     "set dataset.mock=true (no blend: megatron-core trains on mock data), or give a blend "
                     "(--data-path)" if runs == "mock" else "set dataset.mock=false")


def _weight_decay(before, lines: list[str]) -> Effective:
    import torch
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    opt, sch = before.optimizer, copy.deepcopy(before.scheduler)
    proxy = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=opt.lr, weight_decay=opt.weight_decay)
    proxy.param_groups[0]["wd_mult"] = 1.0
    train_iters = before.train.train_iters or 1
    gbs = before.train.global_batch_size or 1
    # megatron-bridge 0.6.2 training/config.py ConfigContainer._calculate_scheduler_steps, in samples
    wd_steps = train_iters * gbs
    decay_steps = (sch.lr_decay_iters or train_iters) * gbs
    warmup = (sch.lr_warmup_iters or 0) * gbs
    start = sch.start_weight_decay if sch.start_weight_decay is not None else opt.weight_decay
    end = sch.end_weight_decay if sch.end_weight_decay is not None else opt.weight_decay
    with capture(lines):
        scheduler = OptimizerParamScheduler(
            proxy, init_lr=sch.lr_warmup_init, max_lr=opt.lr, min_lr=opt.min_lr, lr_warmup_steps=warmup,
            lr_decay_steps=max(decay_steps, warmup + 1), lr_decay_style=sch.lr_decay_style, start_wd=start,
            end_wd=end, wd_incr_steps=wd_steps, wd_incr_style=sch.weight_decay_incr_style)
        scheduler.step(gbs)
    runs = round(float(proxy.param_groups[0]["weight_decay"]), 12)
    return Effective("weight_decay_at_step_1", float(opt.weight_decay), runs,
                     f"{MCORE} optimizer_param_scheduler.py OptimizerParamScheduler.step (start_wd/end_wd from "
                     f"{BRIDGE} training/optim.py: scheduler.start_weight_decay/end_weight_decay)",
                     f"set optimizer.weight_decay={runs} (or scheduler.start_weight_decay/end_weight_decay to the "
                     "decay you mean)")


# --- the layers ------------------------------------------------------------------------------------------------------
def _te_separate_norms(model, moe: bool) -> tuple[bool, bool]:
    """(input norm, pre-MLP norm) that megatron-core's TE layer spec builds as norms of their own (module doc)."""
    mla = bool(getattr(model, "multi_latent_attention", False)) and not getattr(model, "mla_down_proj_fusion", False)
    return mla, moe


def _layer_kinds(model) -> list[bool]:
    """The layer kinds (True = MoE) of the model: megatron-core's ``moe_layer_freq`` (an int or a per-layer list)."""
    if not model.num_moe_experts:
        return [False]
    freq = model.moe_layer_freq
    pattern = list(freq) if isinstance(freq, (list, tuple)) else [int(i % freq == 0) for i in range(model.num_layers)]
    return sorted({bool(x) for x in pattern})


def _layer_config(model):
    """A copy of the resolved provider for one layer on one rank (module doc)."""
    from .local_impl import _TE_KERNELS

    out = copy.copy(model)
    for name in _TE_KERNELS + ("moe_router_fusion",):  # megatron-core's local modules: the kernels, not the flags
        if getattr(out, name, False):
            object.__setattr__(out, name, False)
    for name, value in dict(tensor_model_parallel_size=1, context_parallel_size=1, expert_model_parallel_size=1,
                            expert_tensor_parallel_size=1, pipeline_model_parallel_size=1, sequence_parallel=False,
                            fp8=None, fp4=None, use_cpu_initialization=True, perform_initialization=False,
                            layernorm_zero_centered_gamma=False).items():
        object.__setattr__(out, name, value)
    return out


_LAYER_CACHE: dict[tuple, tuple[dict, tuple[str, ...]]] = {}


def _layer_key(model, moe: bool) -> tuple:
    fields = ("recompute_granularity", "recompute_modules", "cuda_graph_impl", "cuda_graph_modules",
              "moe_token_dispatcher_type", "moe_latent_size", "moe_shared_expert_intermediate_size",
              "moe_shared_expert_overlap", "multi_latent_attention", "num_moe_experts", "normalization")
    return (moe,) + tuple(str(getattr(model, f, None)) for f in fields)


def _build_layer(model, moe: bool, stand_ins: list[str]) -> tuple[dict, tuple[str, ...]]:
    """(recompute flags, warnings) of one TransformerLayer of the kind (cached per kind and deciding fields)."""
    key = _layer_key(model, moe)
    if key in _LAYER_CACHE:
        return _LAYER_CACHE[key]
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_submodules
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import ModuleSpec, build_module
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from .probe import substitutions as subs
    from .probe.build import _flex_backend_installed
    from .probe.fake_world import fake_world

    config = _layer_config(model)
    mlp_config = config
    if moe and config.moe_token_dispatcher_type == "flex" and not _flex_backend_installed(
            config.moe_flex_dispatcher_backend):
        mlp_config = copy.copy(config)
        object.__setattr__(mlp_config, "moe_token_dispatcher_type", "alltoall")
    local = get_gpt_layer_local_submodules(num_experts=config.num_moe_experts if moe else None,
                                           moe_grouped_gemm=False, qk_layernorm=bool(config.qk_layernorm))
    separate_input, separate_pre_mlp = _te_separate_norms(config, moe)
    real_mlp = local.mlp

    def mlp(config=None, **kwargs):  # the block's own config: the dispatcher stand-in (module doc)
        if isinstance(real_mlp, ModuleSpec):
            return build_module(real_mlp, config=mlp_config, **kwargs)
        return real_mlp(config=mlp_config, **kwargs)

    local.input_layernorm = local.input_layernorm if separate_input else IdentityOp
    local.pre_mlp_layernorm = local.pre_mlp_layernorm if separate_pre_mlp else IdentityOp
    local.self_attention = IdentityOp
    local.mlp = mlp
    lines: list[str] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(fake_world(1, 0))
        stack.enter_context(capture(lines))
        stack.enter_context(torch.device("meta"))
        subs._install_meta_device(stack)  # the build harness's stand-ins: CUDA device and streams on the meta device
        subs._install_dispatcher_stream(stack)
        parallel_state.initialize_model_parallel(create_gloo_process_groups=False)
        layer = build_module(ModuleSpec(module=TransformerLayer, submodules=local), config=config, layer_number=1,
                             pg_collection=ProcessGroupCollection.use_mpu_process_groups())
        flags = {"recompute_input_layernorm": bool(layer.recompute_input_layernorm),
                 "recompute_pre_mlp_layernorm": bool(layer.recompute_pre_mlp_layernorm),
                 "separate_input_norm": not isinstance(layer.input_layernorm, IdentityOp),
                 "separate_pre_mlp_norm": not isinstance(layer.pre_mlp_layernorm, IdentityOp),
                 "moe": bool(layer.is_moe_layer)}
    _LAYER_CACHE[key] = (flags, tuple(line for line in lines if "recompute" in line))
    return _LAYER_CACHE[key]


def _layers(before, model, lines: list[str], stand_ins: list[str]) -> list[Effective]:
    granularity = before.model.recompute_granularity
    modules = list(before.model.recompute_modules or []) if granularity == "selective" else []
    out, recomputed, listed = [], [], "layernorm" in modules
    for moe in _layer_kinds(model):
        flags, logged = _build_layer(model, moe, stand_ins)
        lines += logged
        kind = "moe" if moe else "dense"
        source = f"{MCORE} transformer/transformer_layer.py TransformerLayer.__init__ (built: one {kind} layer)"
        # the config's 'layernorm' asks to recompute each norm the layer has as a module of its own
        for norm, separate, flag in (("input_layernorm", flags["separate_input_norm"], "recompute_input_layernorm"),
                                     ("pre_mlp_layernorm", flags["separate_pre_mlp_norm"],
                                      "recompute_pre_mlp_layernorm")):
            stated = listed and separate
            out.append(Effective(f"layer[{kind}].{flag}", stated, flags[flag], source,
                                 "drop 'layernorm' from model.recompute_modules (megatron-core skips it here: see "
                                 "its logged warning) and price the norm's output as kept"))
        recomputed.append(flags["recompute_input_layernorm"] or flags["recompute_pre_mlp_layernorm"])
    if listed and not any(recomputed):
        out.append(Effective("layernorm_recompute_does_anything", True, False,
                             f"{MCORE} transformer/transformer_layer.py TransformerLayer.__init__ (built: one layer of "
                             "each kind; no norm of any is recomputed)",
                             "drop 'layernorm' from model.recompute_modules: no layer recomputes a norm"))
    if not _te_ok():
        stand_ins.append("layer norms as megatron-core's TE layer spec builds them (input norm fused into TE's QKV "
                         "linear except for MLA; pre-MLP norm a module of its own in MoE layers only); attention "
                         "an IdentityOp; one expert-parallel rank; the torch norm without zero-centred gamma (a "
                         "parametrisation torch's norm lacks)")
    return out


def _te_ok() -> bool:
    from .stack import te_installed

    return te_installed()


# --- the optimizer ---------------------------------------------------------------------------------------------------
class _Stream:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, *args) -> None:
        pass

    def record_event(self, *args) -> "_Stream":
        return self

    def wait(self, *args) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *args) -> None:
        pass


_OPTIMIZER_CACHE: dict[tuple, tuple[str, str, tuple[str, ...]]] = {}


def _optimizer(before, after, lines: list[str], stand_ins: list[str]) -> list[Effective]:
    opt = before.optimizer
    if opt.optimizer not in ("adam", "sgd"):  # Muon and the other emerging optimizers: another builder
        stand_ins.append(f"optimizer '{opt.optimizer}' not read back (megatron-core builds it outside "
                         "_get_megatron_optimizer_based_on_param_groups)")
        return []
    offload = bool(opt.optimizer_cpu_offload)
    fraction = float(opt.optimizer_offload_fraction or 0.0) if offload else 0.0
    aware = bool(opt.use_precision_aware_optimizer)
    stated = _plain(opt.exp_avg_dtype) if aware else "float32"
    key = (offload, aware, str(opt.exp_avg_dtype), str(opt.exp_avg_sq_dtype), opt.optimizer,
           bool(opt.decoupled_weight_decay), bool(opt.overlap_cpu_optimizer_d2h_h2d))
    if key not in _OPTIMIZER_CACHE:
        _OPTIMIZER_CACHE[key] = _build_optimizer(after.optimizer)  # finalized (its derived fields set)
    moment, kind, logged = _OPTIMIZER_CACHE[key]
    lines += logged
    stand_ins.append("proxy optimizer: two parameters in the dtype its wrapper hands it (FP32 main parameters; BF16 "
                     "with the precision-aware optimizer), no distributed-optimizer sharding nor wrapper, CUDA streams "
                     "on the CPU" + ("" if _te_ok() or offload or not aware else
                                             "; TE's FusedAdam as torch AdamW keeping exp_avg_dtype"))
    source = (f"{MCORE} optimizer/__init__.py _get_megatron_optimizer_based_on_param_groups (built: {kind}, "
              "stepped once)")
    where = ("host" if fraction >= 1 else f"host {fraction:.0%}, GPU {1 - fraction:.0%}") if offload else "GPU"
    fix = (f"set optimizer.exp_avg_dtype=torch.{moment} and exp_avg_sq_dtype=torch.{moment}"
           + (" (HybridDeviceOptimizer keeps FP32 Adam states under optimizer_cpu_offload)" if offload else ""))
    return [Effective("optimizer.moment_dtype", stated, moment, source, fix),
            Effective("optimizer.state_location", where, where, source + "; optimizer_offload_fraction")]


def _build_optimizer(opt) -> tuple[str, str, tuple[str, ...]]:
    """(Adam moment dtype, optimizer class built, warnings) of megatron-core's optimizer for ``opt`` on a proxy."""
    import torch
    import megatron.core.optimizer as mopt
    from megatron.core import parallel_state

    from .probe.fake_world import fake_world
    from .probe.substitutions import patch_until

    config = copy.deepcopy(opt)
    config.use_distributed_optimizer = False
    proxy = torch.nn.Module()
    # what the wrapper hands the inner optimizer: FP32 main parameters (megatron-core optimizer/optimizer.py
    # Float16OptimizerWithFloat16Params, optimizer/distrib_optimizer.py), or, with the precision-aware optimizer, the
    # BF16 model parameters (its Adam keeps the master weights)
    dtype = torch.bfloat16 if config.use_precision_aware_optimizer else torch.float32
    proxy.weight = torch.nn.Parameter(torch.zeros(4, 4, dtype=dtype))
    proxy.bias = torch.nn.Parameter(torch.zeros(4, dtype=dtype))
    built: list = []
    lines: list[str] = []

    def unwrapped(inner, *args, **kwargs):  # the wrapper allocates CUDA tensors: keep the inner optimizer
        built.append(inner)
        return inner

    class _AdamKeepingDtype(torch.optim.AdamW):  # TE's FusedAdam's exp_avg_dtype, on torch's AdamW (module doc)
        def __init__(self, params, exp_avg_dtype=None, exp_avg_sq_dtype=None, **kwargs):
            for extra in ("master_weights", "use_decoupled_grad", "master_weight_dtype", "store_param_remainders",
                          "adam_w_mode"):
                kwargs.pop(extra, None)
            super().__init__(params, **kwargs)
            self.moment_dtype = exp_avg_dtype

    with contextlib.ExitStack() as stack:
        patch = lambda owner, attr, value: patch_until(stack, owner, attr, value)  # noqa: E731
        for name in ("Float16OptimizerWithFloat16Params", "FP32Optimizer", "DistributedOptimizer"):
            patch(mopt, name, unwrapped)
        patch(torch.cuda, "current_stream", lambda *a, **k: _Stream())
        patch(torch.cuda, "Stream", _Stream)
        patch(torch.cuda, "stream", lambda *a, **k: contextlib.nullcontext())
        if not _te_ok() and config.use_precision_aware_optimizer and not config.optimizer_cpu_offload:
            patch(torch.optim, "AdamW", _AdamKeepingDtype)
        stack.enter_context(fake_world(1, 0))
        stack.enter_context(capture(lines))
        parallel_state.initialize_model_parallel(create_gloo_process_groups=False)
        groups = mopt._get_param_groups([proxy], config, None)
        mopt._get_megatron_optimizer_based_on_param_groups(
            config, [proxy], groups, model_parallel_group=parallel_state.get_model_parallel_group(),
            data_parallel_group=parallel_state.get_data_parallel_group())
        inner = built[0]
        kind = type(inner).__name__
        if isinstance(inner, _AdamKeepingDtype) and inner.moment_dtype is not None:
            moment = _plain(inner.moment_dtype)
        else:
            # HybridDeviceOptimizer's own step copies grads from CUDA parameters: step its inner optimizers (the
            # ones that hold the state) on the parameters it gave them
            subs = (list(inner.cpu_optimizers) + [inner.gpu_optimizer]) if hasattr(inner, "cpu_optimizers") \
                else [inner]
            for sub in (o for o in subs if o is not None):
                for group in sub.param_groups:
                    for p in group["params"]:
                        p.grad = torch.ones_like(p)
                sub._optimizer_step_post_hooks.clear()  # its copy back to the CUDA parameter the proxy lacks
                sub.step()
            states = [s for o in subs if o is not None for s in o.state.values()]
            moment = _plain(states[0]["exp_avg"].dtype)
    return moment, kind, tuple(lines)


# --- all of it -------------------------------------------------------------------------------------------------------
def effective_settings(cfg, hardware: str | Hardware, world_size: int, resolved=None,
                       te_version: str | None = None) -> EffectiveSettings:
    """Construct on the CPU what megatron constructs from ``cfg`` for ``world_size`` GPUs of ``hardware`` and read
    back the values that run (module doc). ``cfg`` is never changed. Read back once per config (every field),
    target and Transformer Engine version: a second call -- ``--explain`` / ``--json`` after the check -- returns
    the first one's answer (~0.1 s saved per call, more for a config whose layers were not built yet).

    Args:
        resolved: ``cfg`` after megatron-bridge's ``runtime_config_update`` on the target, where the caller has it
            (:func:`lcmoe_recipes.emit.target.resolve_for_target`); built here otherwise.
        te_version: the Transformer Engine the job runs (megatron-core's TE version gates), default the target's.

    Raises:
        LcmoeError: ``runtime_config_update`` rejects the config (run the check first: its finding has the fix), or
            torch.distributed is already initialised in this process.
    """
    from ..errors import LcmoeError
    from .target import resolve_for_target

    hw = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    key = (_fingerprint(cfg), hw.key, world_size, _te_key(te_version))
    if key in _SETTINGS_CACHE:
        return _SETTINGS_CACHE[key]
    if resolved is None:
        resolved, error = resolve_for_target(cfg, hw, world_size, te_version)
        if error is not None:
            raise LcmoeError(f"megatron-bridge rejects the config for {world_size} x {hw.key}: {error}",
                             "run python -m lcmoe_recipes.check on it: its finding names the fix")
    lines: list[str] = []
    stand_ins: list[str] = []
    with capture(lines):
        rope = _rope_fusion(cfg, resolved.model)
    values = [rope, _grad_buffer(cfg, resolved), _cuda_graphs(cfg, resolved), _data(cfg, lines),
              _weight_decay(cfg, lines)]
    values += _optimizer(cfg, resolved, lines, stand_ins)
    values += _layers(cfg, resolved.model, lines, stand_ins)
    settings = EffectiveSettings(tuple(values), tuple(dict.fromkeys(lines)), tuple(dict.fromkeys(stand_ins)))
    if len(_SETTINGS_CACHE) >= _SETTINGS_CACHE_SIZE:
        del _SETTINGS_CACHE[next(iter(_SETTINGS_CACHE))]  # the oldest
    _SETTINGS_CACHE[key] = settings
    return settings


# one read-back per config, target and TE version: the check (config_findings) and --explain / --json share it
_SETTINGS_CACHE: dict[tuple, EffectiveSettings] = {}
_SETTINGS_CACHE_SIZE = 64


def _fingerprint(value: Any, depth: int = 0) -> Any:
    """Every field of a ConfigContainer, nested dataclasses and containers walked (a field hidden from ``repr``
    included), as a hashable value: two configs with the same fingerprint are read back the same."""
    import dataclasses

    if depth > 12:
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__qualname__,) + tuple((f.name, _fingerprint(getattr(value, f.name, None), depth + 1))
                                                   for f in dataclasses.fields(value))
    if isinstance(value, dict):
        return ("dict",) + tuple(sorted(((repr(k), _fingerprint(v, depth + 1)) for k, v in value.items())))
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_fingerprint(v, depth + 1) for v in value]
        return (type(value).__name__,) + tuple(sorted(items, key=repr) if isinstance(value, (set, frozenset))
                                               else items)
    return repr(value)


def _te_key(te_version: str | None) -> str:
    """The Transformer Engine megatron-core's version gates answer: ``te_version``, else the probe's current answer
    (:func:`lcmoe_recipes.emit.target.te_version_as` may have set it for the check)."""
    if te_version is not None:
        from packaging.version import Version

        return str(Version(te_version))
    import megatron.core.utils as mcore_utils

    return str(getattr(mcore_utils, "_te_version", None))


def effective_findings(cfg, hardware: str | Hardware, world_size: int, own: bool, resolved=None,
                       te_version: str | None = None) -> list[Finding]:
    """:meth:`EffectiveSettings.findings` of :func:`effective_settings`; where torch.distributed is already
    initialised (a rank of a running job), one note instead: the audit ran when the config was written or
    checked."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return []
    return effective_settings(cfg, hardware, world_size, resolved, te_version).findings(own)


__all__ = ["Effective", "EffectiveSettings", "effective_settings", "effective_findings", "capture", "HEADING"]
