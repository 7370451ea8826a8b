"""Hugging Face checkpoint -> Megatron distributed checkpoint, with megatron-bridge's own converter.

:func:`convert_hf_checkpoint` makes the three calls of megatron-bridge 0.6.2's ``AutoBridge.import_ckpt``
(``models/conversion/auto_bridge.py``): ``AutoBridge.from_hf_pretrained(folder)`` ->
``to_megatron_provider(load_weights=True)`` + ``provide_distributed_model(use_cpu_initialization=True)`` (the bridge's
weight mapping loads every Hugging Face tensor into the Megatron model) -> ``save_megatron_model(...,
low_memory_save=True)`` (a ``torch_dist`` checkpoint at iteration 0 with its ``run_config.yaml``, no optimizer state).
It differs from ``import_ckpt`` in three ways only, each for a stated reason:

* the tokenizer is saved with the checkpoint only when the folder has one (``import_ckpt`` always builds it, which
  fails on a weights-only folder);
* where Transformer Engine is absent, the provider uses megatron-core's own modules
  (:func:`lcmoe_recipes.emit.local_impl.use_local_implementation`; the run config then records
  ``transformer_impl: local``);
* the checkpoint is written to ``OUT.partial`` and renamed to ``OUT`` when complete, so an interrupted conversion never
  leaves a folder that looks finished.

Nothing is downloaded: ``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1`` are set before transformers loads, and the
folder is a local path checked by :func:`lcmoe_recipes.checks.weights.check_hf_folder` first.

A GPU is required to *save*: megatron-bridge 0.6.2 stores the CUDA RNG state in every checkpoint
(``training/checkpointing.py``, ``get_rng_state`` calls ``torch.cuda.get_rng_state()``), and megatron-core 0.19.2 builds
MLA layers only with CUDA (``transformer/multi_latent_attention.py`` creates its rotary embedding without
``use_cpu_initialization``). :func:`load_hf_model` (the conversion without the save) runs on a CPU for GQA models.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..catalog import ModelSpec
from ..checks.weights import (CheckpointError, MegatronCheckpoint, check_hf_folder, check_megatron_checkpoint,
                              read_megatron_checkpoint)
from .local_impl import use_local_implementation
from .stack import load_bridge, quiet_upstream, te_installed

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


@dataclass(frozen=True)
class Conversion:
    """What :func:`convert_hf_checkpoint` did.

    Attributes:
        out: the Megatron checkpoint folder (``checkpoint.pretrained_checkpoint`` for training).
        source: the Hugging Face folder it came from (absolute path, as recorded in its run config).
        reused: True when ``out`` already held a complete conversion of ``source`` (nothing was written).
        transformer_impl: "transformer_engine" or "local" (the modules the checkpoint was saved from).
        seconds: wall time of the conversion (0 when reused).
        changes: the local-implementation changes made to the provider (empty with TE).
    """

    out: Path
    source: str
    reused: bool
    transformer_impl: str
    seconds: float = 0.0
    changes: tuple[str, ...] = field(default=())


def _offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def load_hf_model(hf_dir: str | Path, drop_mtp: bool = False, overrides: dict | None = None):
    """The Megatron model of a local Hugging Face folder, weights loaded by megatron-bridge's mapping (no save).

    Needs ``torch.distributed`` and megatron-core's model-parallel state initialised (one rank is enough; gloo works
    on a CPU). Where TE is absent the provider is switched to megatron-core's local modules first.
    ``overrides`` (provider field -> value) are set last, before the model is built: e.g. the CPU proof sets
    ``moe_token_dispatcher_type="allgather"`` because megatron-core 0.19.2's ``MoEAlltoAllTokenDispatcher.__init__``
    creates a ``torch.cuda.Stream`` (the dispatcher moves tokens; it holds no weight).

    Returns:
        (bridge, model, changes): the ``AutoBridge``, the list of Megatron modules (one per virtual stage), and the
        local-implementation changes (empty with TE).

    Raises:
        NeedsTransformerEngine: see :func:`lcmoe_recipes.emit.local_impl.use_local_implementation`.
    """
    _offline()
    load_bridge(quiet=True)
    from megatron.bridge import AutoBridge

    with quiet_upstream():
        bridge = AutoBridge.from_hf_pretrained(str(Path(hf_dir).resolve()))
        provider = bridge.to_megatron_provider(load_weights=True)
    changes = [] if te_installed() else use_local_implementation(provider, drop_mtp=drop_mtp)
    if drop_mtp:
        provider.mtp_num_layers = None
    provider.use_cpu_initialization = True
    for name, value in (overrides or {}).items():
        setattr(provider, name, value)
    with quiet_upstream():
        provider.finalize()
        model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
    return bridge, model, changes


def find_reusable(out_dir: str | Path, hf_dir: str | Path, spec: ModelSpec) -> MegatronCheckpoint | None:
    """The complete conversion of ``hf_dir`` already in ``out_dir``, or None when ``out_dir`` does not exist.

    Raises:
        CheckpointError: ``out_dir`` exists but is not a complete conversion of ``hf_dir`` into ``spec``'s model
            (another source, another model, or an unfinished save): it is never overwritten.
    """
    out = Path(out_dir)
    if not out.exists():
        return None
    fix = f"remove '{out}' or give another --out"
    try:
        ckpt = check_megatron_checkpoint(out, spec)
    except CheckpointError as exc:
        raise CheckpointError(f"`out` '{out}' already exists and is not a usable conversion: {exc.message}", fix,
                              fields=("out",)) from None
    source = Path(hf_dir).resolve()
    if ckpt.hf_source is None or Path(ckpt.hf_source).resolve() != source:
        raise CheckpointError(f"`out` '{out}' already holds a conversion of "
                              f"'{ckpt.hf_source or 'an unrecorded source'}', not of '{source}'", fix, fields=("out",))
    return ckpt


def convert_hf_checkpoint(hf_dir: str | Path, out_dir: str | Path, spec: ModelSpec, drop_mtp: bool = False,
                          log=print) -> Conversion:
    """Convert (or reuse) a local Hugging Face checkpoint of ``spec``'s model into a Megatron checkpoint.

    Args:
        hf_dir: local folder with config.json and weights (never a hub id).
        out_dir: the Megatron checkpoint folder to write (or reuse).
        spec: the catalogue entry of the model being planned; the folder must hold that model.
        drop_mtp: leave the multi-token-prediction layers out (only needed without TE; see ``local_impl``).
        log: where progress lines go.

    Returns:
        :class:`Conversion`.

    Raises:
        CheckpointError: the folder is not ``spec``'s model or lacks weights; ``out_dir`` exists with something else;
            no GPU here (saving needs CUDA, see the module doc).
        NeedsTransformerEngine: a part of the model that needs TE, where TE is absent.
    """
    hf = Path(hf_dir).resolve()
    check_hf_folder(hf, spec)
    existing = find_reusable(out_dir, hf, spec)
    out = Path(out_dir)
    if existing is not None:
        impl = existing.model.get("transformer_impl", "transformer_engine")
        log(f"convert: reusing '{out}' (iteration {existing.iteration}, converted from '{existing.hf_source}', "
            f"transformer_impl {impl})")
        return Conversion(out, str(hf), True, impl)
    import torch

    if not torch.cuda.is_available():
        raise CheckpointError(
            "converting needs a GPU here: megatron-bridge 0.6.2 saves the CUDA RNG state with every checkpoint "
            "(training/checkpointing.py get_rng_state -> torch.cuda.get_rng_state())",
            "run the conversion on a GPU node: as the first step of the training job, or by hand there with "
            f"`python -m lcmoe_recipes.convert --hf {hf} --out {out} --model {spec.key}`")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # an earlier, interrupted conversion of ours
    start = time.monotonic()
    log(f"convert: {hf} -> {out} ({spec.display}; megatron-bridge AutoBridge, "
        f"{'Transformer Engine' if te_installed() else 'megatron-core local modules, no Transformer Engine'})")
    load_bridge(quiet=True)
    import torch.distributed as dist
    from megatron.bridge.training.model_load_save import temporary_distributed_context

    def run() -> list[str]:
        bridge, model, changes = load_hf_model(hf, drop_mtp=drop_mtp)
        tokenizer = hf if any((hf / name).is_file() for name in _TOKENIZER_FILES) else None
        with quiet_upstream():
            bridge.save_megatron_model(model, str(partial), hf_tokenizer_path=tokenizer and str(tokenizer),
                                       low_memory_save=True)
        return changes

    if dist.is_initialized():
        changes = run()
    else:
        with temporary_distributed_context(backend="nccl"):
            changes = run()
    read_megatron_checkpoint(partial)  # complete before it gets the final name
    os.replace(partial, out)
    seconds = time.monotonic() - start
    for line in changes:
        log(f"convert: without Transformer Engine: {line}")
    log(f"convert: done in {seconds:.0f} s -> {out}")
    return Conversion(out, str(hf), False, "transformer_engine" if te_installed() else "local", seconds, tuple(changes))


def write_random_hf_checkpoint(config: dict, hf_config_class: str, folder: str | Path, seed: int = 0) -> Path:
    """A Hugging Face checkpoint with random weights (``transformers``' own initialisation, ``save_pretrained``).

    For proofs on small models built locally: a catalogue entry's config.json values (or smaller ones) go in, a
    folder that :func:`convert_hf_checkpoint` accepts comes out. ``hf_config_class`` names the transformers config
    class (e.g. ``"Qwen3MoeConfig"``, as in :class:`lcmoe_recipes.catalog.ModelSpec`).
    """
    _offline()
    import torch
    import transformers

    hf_config = getattr(transformers, hf_config_class)(**config)
    torch.manual_seed(seed)
    with quiet_upstream():
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
        model.save_pretrained(str(folder))
    return Path(folder)
