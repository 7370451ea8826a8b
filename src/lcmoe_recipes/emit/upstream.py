"""megatron-bridge's own recipes, built offline: the base every config of ours starts from.

megatron-bridge 0.6.2 ships *perf recipes* (``megatron.bridge.perf_recipes.<family>.<gpu>.<model>``, functions named
``{model}_pretrain_{N}gpu_{gpu}_{dtype}[_{variant}]_config``: tuned kernels, fusions, dispatcher settings and process
environment for one model on one GPU type) and *library recipes* (``megatron.bridge.recipes...``: the training
defaults of a model). Both build their model with ``AutoBridge.from_hf_pretrained(<hub id>)``, which needs the
Hugging Face hub. :func:`offline_hub` answers that one call from our offline catalogue instead
(``AutoBridge.from_hf_config`` on the shipped config.json values), so the upstream function runs unchanged, here or on
a login node without hub access.

:func:`upstream_config` builds the base a Plan names (``plan.base_recipe``); :func:`discover` lists every upstream
pretrain recipe whose model the catalogue can build, for ``scripts/regen_upstream.py`` (which writes the catalogue's
``upstream_recipes.json``: what the planner knows about upstream's recipes without importing megatron).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import pkgutil
from typing import Callable, Iterator

from ..catalog import ModelSpec, models_by_hf_id
from ..errors import LcmoeError
from .stack import load_bridge, quiet_upstream

RECIPE_PACKAGES = ("megatron.bridge.perf_recipes", "megatron.bridge.recipes")


class NeedsModel(LcmoeError):
    """An upstream recipe asked the hub for a model the offline catalogue does not hold."""

    def __init__(self, hf_id: str) -> None:
        super().__init__(f"upstream recipe needs '{hf_id}', which is not in the offline model catalogue",
                         "plan a catalogue model (python -m lcmoe_recipes.launch --list) or give its config.json")
        self.hf_id = hf_id


@contextlib.contextmanager
def offline_hub(resolve: Callable[[str], ModelSpec]) -> Iterator[None]:
    """While active, ``AutoBridge.from_hf_pretrained(hub_id)`` returns ``AutoBridge.from_hf_config`` of
    ``resolve(hub_id)``'s shipped config.json; nothing contacts a hub.

    Args:
        resolve: hub id -> the catalogue model to build in its place (raise :class:`NeedsModel` for none).
    """
    from megatron.bridge import AutoBridge

    original = AutoBridge.__dict__["from_hf_pretrained"]

    def from_catalogue(cls, path, *args, **kwargs):
        return cls.from_hf_config(resolve(str(path)).hf_config())

    AutoBridge.from_hf_pretrained = classmethod(from_catalogue)
    try:
        yield
    finally:
        AutoBridge.from_hf_pretrained = original


def _function(path: str) -> Callable:
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise LcmoeError(f"upstream recipe '{path}' is not in the installed megatron-bridge",
                         "regenerate the catalogue for this version: python scripts/regen_upstream.py") from None


def upstream_config(path: str, spec: ModelSpec):
    """The ConfigContainer upstream's recipe ``path`` ("module:function") returns, with ``spec`` as its model.

    ``spec`` is the model the recipe was written for, or another model of the same architecture when the
    catalogue has no recipe for ``spec`` itself (the family's recipe; see :mod:`lcmoe_recipes.catalog.upstream`).

    Raises:
        LcmoeError: the function does not exist in the installed megatron-bridge.
    """
    load_bridge(quiet=True)
    with offline_hub(lambda hub_id: spec), quiet_upstream():
        return _function(path)()


def discover() -> Iterator[tuple[str, str, object]]:
    """(function path, hub id, ConfigContainer) for every upstream pretrain recipe the catalogue can build.

    Recipes whose model the catalogue lacks, and recipes that fail to build offline, are skipped.
    """
    load_bridge(quiet=True)
    by_id = models_by_hf_id()

    def resolve(hub_id: str) -> ModelSpec:
        asked.append(hub_id)
        if hub_id not in by_id:
            raise NeedsModel(hub_id)
        return by_id[hub_id]

    for package_name in RECIPE_PACKAGES:
        package = importlib.import_module(package_name)
        for info in pkgutil.walk_packages(package.__path__, package_name + "."):
            try:
                module = importlib.import_module(info.name)
            except Exception:  # noqa: BLE001 - an upstream module that does not import here is not a base
                continue
            for name, fn in inspect.getmembers(module, inspect.isfunction):
                if fn.__module__ != module.__name__ or "_pretrain_" not in name or not name.endswith("_config"):
                    continue
                if inspect.signature(fn).parameters:
                    continue
                asked: list[str] = []
                try:
                    with offline_hub(resolve), quiet_upstream():
                        cfg = fn()
                except Exception:  # noqa: BLE001 - needs another model, or does not build offline
                    continue
                if asked:
                    yield f"{info.name}:{name}", asked[0], cfg


_DTYPES = {"bf16": "bf16", "fp8cs": "fp8_cs", "fp8sc": "fp8_blockwise", "fp8mx": "mxfp8"}


def summarize(path: str, hub_id: str, cfg) -> dict | None:
    """The catalogue record of one upstream recipe: its name's parts and the settings the planner and the cost model
    read (layout, pipeline layout string, precision, optimizer and gradient dtypes, init, dispatcher, graphs,
    recompute, data-loader workers, EP all-to-all overlap, the optimizer). None for a name outside upstream's naming scheme or a precision we do not plan
    (NVFP4)."""
    import re

    import torch

    from .fields import dispatcher_num_sms, grad_reduce_in_fp32, layout_to_str

    name = path.partition(":")[2]
    match = re.fullmatch(r"(?P<stem>.+?)_pretrain_(?P<gpus>\d+)gpu_(?P<gpu>[a-z0-9]+)_(?P<dtype>[a-z0-9]+)"
                         r"(?:_(?P<variant>.+))?_config", name)
    if match is None or match["dtype"] not in _DTYPES:
        return None
    m, opt = cfg.model, cfg.optimizer
    dtype = lambda value: "bf16" if value == torch.bfloat16 else "fp32"  # noqa: E731
    precision_aware = bool(opt.use_precision_aware_optimizer)
    return {
        "function": path, "hf_id": hub_id, "kind": "perf" if ".perf_recipes." in path else "library",
        "hardware": match["gpu"], "gpus": int(match["gpus"]), "precision": _DTYPES[match["dtype"]],
        "variant": match["variant"] or "",
        "tp": m.tensor_model_parallel_size, "pp": m.pipeline_model_parallel_size,
        "vpp": m.virtual_pipeline_model_parallel_size, "cp": m.context_parallel_size,
        "ep": m.expert_model_parallel_size, "etp": m.expert_tensor_parallel_size,
        "pipeline_model_parallel_layout": layout_to_str(m.pipeline_model_parallel_layout),
        "mtp_num_layers": m.mtp_num_layers or 0,
        "grad_dtype": "fp32" if grad_reduce_in_fp32(cfg) else "bf16",
        "use_precision_aware_optimizer": precision_aware,
        "moment_dtype": dtype(opt.exp_avg_dtype) if precision_aware else "fp32",
        "init_method_std": m.init_method_std, "cross_entropy_fusion_impl": m.cross_entropy_fusion_impl,
        "moe_router_dtype": {"torch.float32": "fp32", "torch.float64": "fp64"}.get(str(m.moe_router_dtype),
                                                                                  m.moe_router_dtype),
        "lr": opt.lr, "min_lr": opt.min_lr, "optimizer": opt.optimizer,
        "dispatcher": [m.moe_token_dispatcher_type, m.moe_flex_dispatcher_backend],
        "cuda_graph_impl": m.cuda_graph_impl,
        "recompute_modules": list(m.recompute_modules or []) if m.recompute_granularity == "selective" else [],
        "num_workers": cfg.dataset.num_workers,
        "moe_ep_overlap": bool(cfg.comm_overlap is not None and cfg.comm_overlap.overlap_moe_expert_parallel_comm),
        "tp_comm_overlap": bool(cfg.comm_overlap is not None and cfg.comm_overlap.tp_comm_overlap),
        "use_transformer_engine_op_fuser": bool(getattr(m, "use_transformer_engine_op_fuser", False)),
        "moe_flex_dispatcher_num_sms": dispatcher_num_sms(m),
    }
