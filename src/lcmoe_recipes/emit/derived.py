"""Settings derived from a quantity an override changed, derived again for the new value.

A named recipe's fields are not independent: ``cp_comm_type`` was chosen for its CP, ``sequence_parallel`` for its TP,
the pipeline layout for its PP x VPP, the YaRN factor and GBS for its seq_length, the CUDA-graph scopes for its
recompute. When a Hydra override changes one of those quantities and leaves the settings derived from it alone, the
old derived values would either be refused by megatron (hierarchical CP sizes whose product is no longer CP, a
layout with the wrong number of stages, full recompute with CUDA graphs) or run silently wrong (YaRN positions that no
longer cover seq_length, a token budget per step that changed with seq_length).

:func:`follow_overrides` re-derives each dependent setting with the same rule the planner used, writes it on the config
and returns the overrides that reproduce it (so the YAML header rebuilds the same config) with the reason; a setting
that an override sets itself is never touched (the user's value wins, and the checks judge it). Each pair:

=====================================  ====================================================  ========================
override of                            re-derives                                            rule
=====================================  ====================================================  ========================
TP                                     ``sequence_parallel`` (on exactly when TP > 1)        megatron-core 0.19.2
                                                                                             ModelParallelConfig
CP or TP                               ``cp_comm_type``, ``hierarchical_context_parallel_    :func:`~lcmoe_recipes.rules.
                                       sizes``                                               cp.choose_cp_comm`
EP or ETP                              HybridEP's ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_       megatron-bridge 0.6.2 perf
                                       DOMAIN`` (EP x ETP)                                   recipes' env_vars
dispatcher type or backend             the per-rank capacity (``moe_expert_rank_capacity_    megatron-core 0.19.2
                                       factor``, ``moe_paged_stash``: HybridEP / NCCL-EP     TransformerConfig
                                       only) and HybridEP's environment
PP or VPP                              ``pipeline_model_parallel_layout`` (a layout string   :func:`~lcmoe_recipes.core.
                                       only where the config had one)                        pipeline.build_pipeline_
                                                                                             layout`
``model.seq_length`` or                the other of the two, the RoPE / YaRN positions, and  :func:`~lcmoe_recipes.rules.
``dataset.seq_length``                 GBS for the same tokens per step                      positions.choose_positions`,
                                                                                             :func:`~lcmoe_recipes.rules.
                                                                                             batch.choose_batch`
``mixed_precision``                    ``moe_router_padding_for_quantization`` (FP8 / FP4    megatron-core 0.19.2
                                       only)                                                 TransformerConfig
recompute                              the CUDA-graph implementation and scopes              :func:`~lcmoe_recipes.rules.
                                                                                             cuda_graphs.choose_cuda_
                                                                                             graphs`
=====================================  ====================================================  ========================

The FP8 / MXFP8 alignment of the tokens per rank after a precision (or CP, or seq_length) override is not a setting
to derive: the check (rule ``fp8/alignment``) refuses it and names the CP values that fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..catalog.config_fields import override_key
from ..core.plan import Plan, Reason
from ..errors import LcmoeError
from .fields import precision_of
from .settings import HYBRID_EP_ENV, SETTINGS, flat_fields

_SETTING = {s.key: s for s in SETTINGS}


@dataclass(frozen=True)
class Derived:
    """One setting derived again: the overrides that reproduce it (``model.x=v``, ``+env_vars.Y=v``, ``~path``),
    the reason key it is recorded under (``Plan.reasons``), and the reason (what changed, from what, by which rule)."""

    overrides: tuple[str, ...]
    key: str
    reason: Reason


def _value_text(value: Any) -> str:
    """A value in Hydra's override grammar: null, true/false, [a,b], a quoted string where Hydra would misparse it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_value_text(v) for v in value) + "]"
    if isinstance(value, str) and not value.replace("_", "").replace("+", "").replace("-", "").isalnum():
        return "'" + value.replace("'", "\\'") + "'"
    return str(value)


def _changed(before: dict, after: dict) -> tuple[str, ...]:
    """The overrides that take a config from ``before`` to ``after`` (flat dotted fields)."""
    out = []
    for path in sorted(before.keys() | after.keys()):
        if path not in after:
            out.append(f"~{path}")
        elif path not in before:
            out.append(f"+{path}={_value_text(after[path])}")
        elif before[path] != after[path]:
            out.append(f"{path}={_value_text(after[path])}")
    return tuple(out)


@dataclass(frozen=True)
class _Pair:
    """A quantity (``triggers``: override keys) and the setting derived from it (``setting``: a
    :data:`~lcmoe_recipes.emit.settings.SETTINGS` key, whose fields an override must not set); ``derive(cfg, shown,
    old)`` returns the Plan with the setting derived again and the reason, or None when nothing depends on it here."""

    triggers: tuple[str, ...]
    setting: str
    derive: Callable[[Any, Plan, Plan, str], tuple[Plan, str, str] | None]
    guards: tuple[str, ...] | None = None
    """The fields whose override keeps this setting as the user set it (default: every field of the setting)."""

    def guarded(self, keys: set[str]) -> bool:
        if self.guards is not None:
            return bool(keys & set(self.guards))
        setting = _SETTING[self.setting]
        return any(setting.owns(key) for key in keys)


def _sp(cfg, shown: Plan, old: Plan, rope: str):
    tp = shown.layout.tp
    if shown.sequence_parallel == (tp > 1):
        return None
    note = (f"derived again for TP={tp}: sequence parallelism " + ("on (megatron-core warns that expert and tensor "
            "parallelism together need it)" if tp > 1 else "off (megatron-core refuses it without TP)"))
    return shown.with_changes(sequence_parallel=tp > 1), note, "megatron-core 0.19.2 model_parallel_config.py"


def _cp_comm(cfg, shown: Plan, old: Plan, rope: str):
    from ..rules.cp import choose_cp_comm

    comm, split, why = choose_cp_comm(shown)
    split = tuple(split) if split else None
    if (comm, split) == (shown.cp_comm_type, shown.hierarchical_cp_sizes):
        return None
    before = f"cp_comm_type {shown.cp_comm_type!r}" + (f" with hierarchical_context_parallel_sizes "
                                                       f"{list(shown.hierarchical_cp_sizes)}"
                                                       if shown.hierarchical_cp_sizes else "")
    note = f"derived again for CP={shown.layout.cp}, TP={shown.layout.tp} (was {before}): {why.why}"
    return shown.with_changes(cp_comm_type=comm, hierarchical_cp_sizes=split), note, why.source


def _dispatcher(cfg, shown: Plan, old: Plan, rope: str):
    lay = shown.layout
    note = (f"derived again for EP={lay.ep}, ETP={lay.etp}, dispatcher {shown.moe_token_dispatcher_type}"
            + (f"/{shown.moe_flex_dispatcher_backend}" if shown.moe_token_dispatcher_type == "flex" else "")
            + ": HybridEP's ranks per NVLink domain are EP x ETP; the per-rank expert capacity (and the paged stash "
              "built on it) is HybridEP's / NCCL-EP's only, and megatron-core refuses it with any other dispatcher")
    return shown, note, ("megatron-core 0.19.2 transformer/transformer_config.py (moe_expert_rank_capacity_factor); "
                         "megatron-bridge 0.6.2 perf_recipes/<model>/gb200/*.py env_vars")


def _pipeline_layout(cfg, shown: Plan, old: Plan, rope: str):
    from ..core.pipeline import build_pipeline_layout, layout_stages

    text = shown.pipeline_model_parallel_layout
    stages = shown.layout.pp * (shown.layout.vpp or 1)
    if text is None or len(layout_stages(text)) == stages:
        return None  # megatron's own even split, or still the right number of stages
    spec = shown.model_spec
    new = build_pipeline_layout(spec.num_layers, stages, shown.mtp_num_layers)
    note = (f"derived again for PP={shown.layout.pp} x VPP={shown.layout.vpp or 1} = {stages} stages (was "
            f"'{text}', {len(layout_stages(text))} stages): " + (f"'{new}' spreads the {spec.num_layers} decoder "
            "layers evenly, embedding on the first stage, loss (and MTP) on the last" if new else
            "no layout string (a single stage)"))
    return (shown.with_changes(pipeline_model_parallel_layout=new), note,
            "lcmoe_recipes.core.pipeline.build_pipeline_layout; megatron-core 0.19.2 PipelineParallelLayerLayout")


def _seq_both(cfg, shown: Plan, old: Plan, rope: str):
    model, data = cfg.model.seq_length, cfg.dataset.seq_length
    if model == data:
        return None
    new = model if model != old.seq_length else data
    note = f"derived again: seq_length {new:,} on both model and dataset (megatron-bridge requires them equal)"
    return shown.with_changes(seq_length=new), note, "megatron-bridge 0.6.2 training/config.py ConfigContainer.validate"


def _positions(cfg, shown: Plan, old: Plan, rope: str):
    from ..rules.positions import choose_positions

    if shown.seq_length == old.seq_length:
        return None
    chosen, why = choose_positions(shown.model_spec, shown.seq_length, rope)
    if chosen == shown.positions:
        return None
    return (shown.with_changes(positions=chosen),
            f"derived again for seq_length {shown.seq_length:,} (was {old.seq_length:,}): {why.why}", why.source)


def _batch(cfg, shown: Plan, old: Plan, rope: str):
    from ..rules.batch import choose_batch

    if shown.seq_length == old.seq_length:
        return None
    tokens = old.global_batch_size * old.seq_length
    gbs, why = choose_batch(shown.seq_length, shown.layout, shown.micro_batch_size, tokens)
    if gbs == shown.global_batch_size:
        return None
    return (shown.with_changes(global_batch_size=gbs),
            f"derived again for seq_length {shown.seq_length:,} (was GBS {shown.global_batch_size} x "
            f"{old.seq_length:,}): the same {tokens / 1e6:.1f}M tokens per step -> {why.why}", why.source)


def _padding(cfg, shown: Plan, old: Plan, rope: str):
    padded = bool(getattr(cfg.model, "moe_router_padding_for_quantization", False))
    if not padded or precision_of(cfg.mixed_precision) != "bf16":
        return None
    cfg.model.moe_router_padding_for_quantization = False
    return (shown, "derived again for BF16: no padding of routed tokens (it pads them for FP8 / FP4 GEMMs, and "
            "megatron-core refuses it without them)", "megatron-core 0.19.2 transformer/transformer_config.py "
            "(moe_router_padding_for_quantization)")


def _graphs(cfg, shown: Plan, old: Plan, rope: str):
    from ..rules.cuda_graphs import choose_cuda_graphs

    if shown.cuda_graph_impl == "none":
        return None  # no graphs to keep compatible
    (impl, modules), why = choose_cuda_graphs(shown.hardware_spec, shown.variable_length,
                                              shown.recompute_granularity, shown.recompute_modules,
                                              shown.moe_flex_dispatcher_backend, shown.model_spec.is_moe)
    if (impl, tuple(modules)) == (shown.cuda_graph_impl, tuple(shown.cuda_graph_modules)):
        return None
    recompute = shown.recompute_granularity or "none"
    if shown.recompute_granularity == "selective":
        recompute += f" ({', '.join(shown.recompute_modules)})"
    note = (f"derived again for recompute {recompute} (was {shown.cuda_graph_impl} graphs on "
            f"{', '.join(shown.cuda_graph_modules) or 'the whole layer'}): {why.why}")
    return shown.with_changes(cuda_graph_impl=impl, cuda_graph_modules=tuple(modules)), note, why.source


_LAYOUT = "model.{}_parallel_size"
PAIRS: tuple[_Pair, ...] = (
    _Pair(("model.seq_length", "dataset.seq_length"), "seq_length", _seq_both, guards=()),
    _Pair(("model.seq_length", "dataset.seq_length"), "positions", _positions),
    _Pair(("model.seq_length", "dataset.seq_length"), "global_batch_size", _batch),
    _Pair((_LAYOUT.format("pipeline_model"), "model.virtual_pipeline_model_parallel_size"),
          "pipeline_model_parallel_layout", _pipeline_layout),
    _Pair((_LAYOUT.format("tensor_model"),), "sequence_parallel", _sp),
    _Pair((_LAYOUT.format("context"), _LAYOUT.format("tensor_model")), "cp_comm_type", _cp_comm),
    _Pair((_LAYOUT.format("expert_model"), _LAYOUT.format("expert_tensor"), "model.moe_token_dispatcher_type",
           "model.moe_flex_dispatcher_backend"), "dispatcher", _dispatcher,
          guards=("model.moe_expert_rank_capacity_factor", "model.moe_paged_stash", "model.moe_shared_expert_overlap",
                  *(f"env_vars.{name}" for name in HYBRID_EP_ENV))),
    _Pair(("mixed_precision",), "precision", _padding, guards=("model.moe_router_padding_for_quantization",)),
    _Pair(("model.recompute_granularity", "model.recompute_modules", "model.recompute_method",
           "model.recompute_num_layers"), "cuda_graphs", _graphs),
)
"""Every pair, in the order they are derived (a later pair sees the earlier pairs' values: the pipeline layout comes
before the pairs whose rule prices the step, which reads the layers of each pipeline stage)."""


def follow_overrides(cfg, overrides: list[str], shown: Plan, old: Plan, rope: str = "auto",
                     read_back: Callable[[Any], Plan] | None = None) -> tuple[Plan, list[Derived]]:
    """Derive again, in ``cfg`` in place, every setting of :data:`PAIRS` whose quantity an override changed and which
    no override sets itself.

    Args:
        cfg: the ConfigContainer with ``overrides`` applied.
        shown: ``cfg`` read back into a Plan (:func:`lcmoe_recipes.emit.readback.plan_from_config`).
        old: the Plan the config was made from (before the overrides): the old seq_length and tokens per step.
        rope: the request's positions wish (``TrainingRequest.rope``), for positions derived again.
        read_back: reads a config into a Plan; when given, the returned Plan is ``cfg`` read again at the end.

    Returns:
        ``(plan, derived)``: the Plan with the derived values, and one :class:`Derived` per setting that changed.

    A rule that cannot derive a value for the new quantity (a CP the GPUs do not fold into, more pipeline stages
    than layers) derives nothing: the checks that follow refuse the quantity itself, with their fix.
    """
    keys = {override_key(text) for text in overrides}
    derived: list[Derived] = []
    for pair in PAIRS:
        hit = any(key == t or key.startswith(t + ".") for key in keys for t in pair.triggers)
        if not hit or pair.guarded(keys):
            continue
        before = flat_fields(cfg)
        try:
            got = pair.derive(cfg, shown, old, rope)
        except LcmoeError:
            continue  # the new quantity itself is infeasible (e.g. a CP the GPUs do not fold into): the checks say so

        if got is None:
            continue
        shown, why, source = got
        if pair.setting != "precision":  # _padding writes its one field itself
            _SETTING[pair.setting].apply(cfg, shown)
        texts = _changed(before, flat_fields(cfg))
        if texts:
            derived.append(Derived(texts, pair.setting, Reason(why, source)))
    if read_back is not None and derived:
        shown = read_back(cfg).with_changes(reasons=shown.reasons)
    return shown, derived
