"""Catalogue of megatron-bridge's own pretrain recipes, and which one a request starts from.

``upstream_recipes.json`` lists every perf recipe and library recipe of the installed megatron-bridge (0.6.2) whose
model the offline catalogue can build, with the settings the planner and the cost model need (gradient and Adam
moment dtypes, precision-aware optimizer, pipeline layout strings, initialisation, data-loader workers, ...). It is
*generated* from upstream by ``python scripts/regen_upstream.py`` (tests/test_parity.py checks it is current), so
planning knows upstream's choices without importing megatron, and nothing here is typed in by hand.

:func:`base_recipe` picks the base of one request, in this order of preference (each step says so in its reason):
the same model, else a model of the same architecture (the *family* recipe); the same GPU type, else its sibling
(H100/H200, B200/B300, GB200/GB300), else any; not built around full-iteration CUDA graphs (upstream's MXFP8
recipes pair them with a paged stash and an expert capacity factor, which long-context shapes and our CUDA-graph rule
do not use); upstream's canonical variant (no ``_dev``, ``_large_scale``, FSDP or paged-stash variants); the same
precision, else BF16; a perf recipe over a library one; the
closest GPU count.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from .hardware import Hardware
from .models import ModelSpec
from .registry import models_by_hf_id

SIBLINGS = {"h100": "h100", "h200": "h100", "b200": "b200", "b300": "b200", "gb200": "gb200", "gb300": "gb200"}
VARIANTS_AVOIDED = ("dev", "large_scale", "fsdp", "hsdp", "paged_stash", "partial_cg", "full_iteration", "ncclep",
                    "32nodes", "functional")


@dataclass(frozen=True)
class UpstreamRecipe:
    """One upstream recipe as recorded in ``upstream_recipes.json`` (see :func:`lcmoe_recipes.emit.upstream.summarize`)."""

    record: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.record[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def name(self) -> str:
        """The function's name, e.g. ``deepseek_v3_pretrain_1024gpu_h100_fp8sc_config``."""
        return self.record["function"].partition(":")[2]

    def layout_for(self, pp: int, vpp: int | None) -> str | None:
        """Upstream's pipeline layout string when it was written for the same PP·VPP, else None."""
        if (self.record["pp"], self.record["vpp"] or 1) == (pp, vpp or 1):
            return self.record["pipeline_model_parallel_layout"]
        return None


@lru_cache(maxsize=1)
def _document() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("upstream_recipes.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def upstream_recipes() -> tuple[UpstreamRecipe, ...]:
    """Every recorded upstream recipe."""
    return tuple(UpstreamRecipe(r) for r in _document()["recipes"])


def find_upstream_recipe(name: str) -> UpstreamRecipe | None:
    """The recorded upstream recipe called ``name`` (its function name, e.g.
    ``deepseek_v3_pretrain_1024gpu_h100_fp8sc_config``, or its "module:function" path); None when none is."""
    for recipe in upstream_recipes():
        if name in (recipe.name, recipe.function):
            return recipe
    return None


def upstream_versions() -> dict[str, str]:
    """The megatron-bridge / megatron-core versions ``upstream_recipes.json`` was generated from."""
    return dict(_document()["versions"])


def _architecture(spec: ModelSpec) -> str:
    return spec.config.get("model_type", spec.hf_config_class)


def base_recipe(spec: ModelSpec, hw: Hardware, precision: str, num_gpus: int) -> tuple[UpstreamRecipe | None, str]:
    """(the upstream recipe a request starts from, how it matched), or (None, why) when no recipe of the model's
    architecture exists (then megatron-bridge's generic pre-training template is the base)."""
    return _base_recipe(spec.published_id, _architecture(spec), hw.key, precision, num_gpus)


@lru_cache(maxsize=4096)
def _base_recipe(hf_id: str, architecture: str, hw_key: str, precision: str,
                 num_gpus: int) -> tuple[UpstreamRecipe | None, str]:
    by_id = models_by_hf_id()
    same_model = [r for r in upstream_recipes() if r.hf_id == hf_id]
    family = [r for r in upstream_recipes() if r.hf_id in by_id and _architecture(by_id[r.hf_id]) == architecture]
    pool = same_model or family
    if not pool:
        return None, (f"megatron-bridge {upstream_versions()['megatron-bridge']} has no recipe for a {architecture} "
                      "model: its generic pre-training template (recipes/common.py _pretrain_common) is the base")

    def rank(r: UpstreamRecipe) -> tuple:
        return (r.hardware != hw_key, SIBLINGS.get(r.hardware) != SIBLINGS.get(hw_key),
                r.cuda_graph_impl == "full_iteration", any(v in r.variant for v in VARIANTS_AVOIDED),
                r.precision != precision, r.precision != "bf16", r.kind != "perf",
                abs(math.log2(r.gpus / num_gpus)), r.name)

    best = min(pool, key=rank)
    how = [("the same model" if same_model else f"the closest family recipe ({by_id[best.hf_id].display}, same "
            f"{architecture} architecture)")]
    how.append(f"{best.hardware.upper()}" + ("" if best.hardware == hw_key else f" (no {hw_key.upper()} recipe)"))
    if best.precision != precision:
        why = (f"upstream's {precision} recipes are full-iteration-graph or development variants" if any(
            r.precision == precision for r in pool) else f"upstream has no {precision} recipe")
        how.append(f"{best.precision} ({why}; ours switches the precision)")
    else:
        how.append(best.precision)
    return best, f"megatron-bridge {best.kind} recipe {best.name}: {', '.join(how)}"
