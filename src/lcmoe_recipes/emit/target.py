"""Answer upstream's probes of the *local* machine for the *target* one, while upstream validation runs.

megatron-bridge's ``runtime_config_update`` / ``ConfigContainer.validate()`` (what ``pretrain`` runs) looks at the
machine it runs on in five places that say nothing about the config itself:

1. the world size: ``torch.distributed``, else ``WORLD_SIZE``, else ``SLURM_NTASKS``, else 1
   -> answered with the planned GPU count (``WORLD_SIZE``);
2. ``torch.cuda.get_device_properties(0)`` when the MoE dispatcher is "flex"
   (``flex_dispatcher_backend.validate_flex_dispatcher_backend``) -> answered with the target GPU's name and
   compute capability from the hardware catalogue, so DeepEP on GB200 is rejected exactly as on a GB200;
3. Transformer Engine's version (``megatron.core.utils.is_te_min_version``, e.g. for fused permutation, the
   router fusion, CUDA graphs) -> in the light environment (no TE here), the cluster container's TE version
   :data:`TARGET_TE_VERSION`; with TE installed, the installed version is used unchanged;
4. in the light environment only: TE's fused kernels that megatron-core imports as ``None`` without TE and checks
   for when a fusion is on -- permutation (``moe_utils.fused_permute`` and friends, ``moe_permute_fusion=True``) and
   RoPE (``rope_utils.fused_apply_rotary_pos_emb[_thd]``, ``apply_rope_fusion=True``, which e.g. the Llama bridge sets) -- and TE's ``FusedAdam``
   signature (imported by ``OptimizerConfig`` for the precision-aware optimizer) -> answered by placeholders that
   exist for the duration of the check and raise if anything tries to run them;
5. the filesystem: ``CheckpointConfig.finalize`` asserts that ``checkpoint.pretrained_checkpoint`` exists
   (``training/utils/checkpoint_utils.file_exists``) -> answered "exists" for exactly the paths given as
   ``cluster_paths`` (they are read on the cluster, which a login node or laptop may not see); every other path
   gets the real answer. The entry script checks them where the job runs
   (:func:`lcmoe_recipes.jobs.node.problems_here`, also under ``--smoke``).

Everything is restored on exit, ``os.environ`` included (``runtime_config_update`` writes ``cfg.env_vars`` into it).
Validation runs on a deep copy of the ConfigContainer (:func:`lcmoe_recipes.emit.validate_config`), so the emitted
config is never changed by any of this.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from types import ModuleType, SimpleNamespace
from typing import Iterable, Iterator

from ..catalog import Hardware
from ..catalog.versions import TARGET_TE_VERSION
from .stack import quiet_upstream, te_installed


# megatron-core modules whose TE-backed functions are None without TE, and those functions.
_TE_FUNCTIONS = {
    "megatron.core.transformer.moe.moe_utils": ("fused_permute", "fused_permute_with_probs",
                                                "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs",
                                                "fused_unpermute"),
    "megatron.core.models.common.embeddings.rope_utils": ("fused_apply_rotary_pos_emb",
                                                          "fused_apply_rotary_pos_emb_thd"),
}


def _target_device_properties(hardware: Hardware):
    major, minor = hardware.compute_capability

    def get_device_properties(device=None):
        return SimpleNamespace(name=hardware.device_name, major=major, minor=minor, total_memory=hardware.hbm_bytes,
                               multi_processor_count=0, is_target_answer=True)

    return get_device_properties


def _target_only(name: str):
    def placeholder(*args, **kwargs):
        raise RuntimeError(f"{name} is a stand-in for the target's Transformer Engine during config validation; "
                           "it cannot run here")

    placeholder.__name__ = name
    return placeholder


class _FusedAdamSignature:
    """Stands for TE's FusedAdam during validation: megatron-core only inspects its constructor signature."""

    def __init__(self, params=None, *, master_weight_dtype=None, exp_avg_dtype=None, exp_avg_sq_dtype=None,
                 use_decoupled_grad=False, **kwargs):
        raise RuntimeError("TE FusedAdam stand-in (config validation only)")


def _exists_on_cluster(real_file_exists, cluster_paths: frozenset[str]):
    def file_exists(path: str) -> bool:
        return str(path) in cluster_paths or real_file_exists(path)

    return file_exists


@contextlib.contextmanager
def target_environment(hardware: Hardware, world_size: int, cluster_paths: Iterable[str | None] = ()) -> Iterator[None]:
    """Make upstream validation see ``world_size`` ranks of ``hardware`` (see the module doc for what is answered),
    with the files in ``cluster_paths`` (None entries ignored) taken to exist."""
    import torch
    import megatron.core.utils as mcore_utils
    import megatron.bridge.training.utils.checkpoint_utils as checkpoint_utils

    saved_env = dict(os.environ)
    saved_props = torch.cuda.get_device_properties
    saved_te_version = mcore_utils._te_version
    light = not te_installed()
    saved_fused: dict[tuple[object, str], object] = {}
    adam_module_name = "transformer_engine.pytorch.optimizers"
    added_adam = False
    saved_file_exists = checkpoint_utils.file_exists
    try:
        checkpoint_utils.file_exists = _exists_on_cluster(saved_file_exists, frozenset(str(p) for p in cluster_paths if p))
        os.environ["WORLD_SIZE"] = str(world_size)
        os.environ.pop("SLURM_NTASKS", None)
        torch.cuda.get_device_properties = _target_device_properties(hardware)
        if light:
            import importlib

            from packaging.version import Version

            mcore_utils._te_version = Version(TARGET_TE_VERSION)
            for module_name, names in _TE_FUNCTIONS.items():
                module = importlib.import_module(module_name)
                for name in names:
                    saved_fused[(module, name)] = getattr(module, name, None)
                    if saved_fused[(module, name)] is None:
                        setattr(module, name, _target_only(name))
            if adam_module_name not in sys.modules:
                stand_in = ModuleType(adam_module_name)
                stand_in.FusedAdam = _FusedAdamSignature
                sys.modules[adam_module_name] = stand_in
                added_adam = True
        yield
    finally:
        checkpoint_utils.file_exists = saved_file_exists
        torch.cuda.get_device_properties = saved_props
        if light:
            mcore_utils._te_version = saved_te_version
            for (module, name), value in saved_fused.items():
                setattr(module, name, value)
            if added_adam:
                sys.modules.pop(adam_module_name, None)
        os.environ.clear()
        os.environ.update(saved_env)


@contextlib.contextmanager
def te_version_as(version: str | None):
    """megatron-core's TE version probe (``megatron.core.utils._te_version``, read by ``is_te_min_version``) answers
    ``version`` for the duration; nothing changes for None."""
    if version is None:
        yield
        return
    import megatron.core.utils as mcore_utils
    from packaging.version import Version

    saved = mcore_utils._te_version
    mcore_utils._te_version = Version(version)
    try:
        yield
    finally:
        mcore_utils._te_version = saved


def resolve_for_target(cfg, hw: Hardware, world_size: int, te_version: str | None = None):
    """(a deep copy of ``cfg`` after megatron-bridge's ``runtime_config_update`` -- mixed-precision resolution, DP
    size, comm-overlap setup, ``validate()`` with the provider's finalize and every megatron-core post-init -- inside
    :func:`target_environment` for ``world_size`` x ``hw``, the exception it raised or
    None). ``cfg`` is never changed; ``checkpoint.pretrained_checkpoint`` is taken to exist (it is read on the
    cluster, and checked where the job runs)."""
    from megatron.bridge.training.config import runtime_config_update

    trial = copy.deepcopy(cfg)
    error = None
    with target_environment(hw, world_size, cluster_paths=[trial.checkpoint.pretrained_checkpoint]), \
            te_version_as(te_version), quiet_upstream():
        try:
            runtime_config_update(trial)
        except (AssertionError, ValueError, RuntimeError, TypeError, AttributeError, KeyError) as exc:
            error = exc
    return trial, error
