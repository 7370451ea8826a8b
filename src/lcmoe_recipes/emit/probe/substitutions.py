"""The build-only stand-ins that let megatron-core build a full-size model on a CPU, on the meta device.

:mod:`lcmoe_recipes.emit.probe.build` builds every pipeline stage through megatron-bridge's own provider. A few lines of
megatron-core 0.19.2 reach for a GPU while *constructing* a model (a CUDA stream, the current CUDA device, a pinned
index moved to the GPU), and a few of its local (non-Transformer-Engine) modules refuse settings only TE's modules
take. None of them creates, shapes or drops a weight. Each is answered here, narrowly:

* a stand-in answers only at the upstream call sites it names (file and line, the line's text checked before it is
  installed); a call from anywhere else reaches the real function and fails as it would;
* everything is installed by :func:`installed` for the duration of one build and restored on exit (no global
  monkeypatch outlives the build);
* ``tests/test_build.py`` checks every named line's text and the hash of every upstream function a stand-in
  re-implements, so an upstream change fails a test instead of rotting silently.

The table :data:`SUBSTITUTIONS` is what the build report and docs/build.md print.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

SITE_PACKAGES_ROOT = "megatron"  # sites are given relative to the folder that holds the ``megatron`` package


@dataclass(frozen=True)
class UpstreamSite:
    """One line of installed upstream code: ``path`` (from the ``megatron`` package's parent folder), 1-based ``line``
    and its expected ``text`` (stripped)."""

    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def file(self) -> Path:
        return _package_parent() / self.path

    def installed_text(self) -> str | None:
        """The stripped text of this line in the installed file (None: no such file or line)."""
        try:
            lines = self.file.read_text(encoding="utf-8").splitlines()
        except OSError:
            return None
        return lines[self.line - 1].strip() if 0 < self.line <= len(lines) else None


@lru_cache(maxsize=1)
def _package_parent() -> Path:
    import megatron.core

    return Path(megatron.core.__file__).resolve().parent.parent.parent


def function_hash(qualified: str) -> str:
    """SHA-256 (first 16 hex digits) of the installed source of ``module:function`` (a re-implemented function)."""
    import importlib

    module, _, name = qualified.partition(":")
    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return hashlib.sha256(inspect.getsource(target).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Substitution:
    """One build-only stand-in.

    Attributes:
        name: short id printed in the report.
        replaces: what it answers, in one line.
        why: why the answer changes no parameter, buffer shape or dtype.
        sites: the upstream lines it stands in for (text checked at install and by the tests).
        reimplements: ``module:function`` -> expected :func:`function_hash`, for a stand-in that re-implements an
            upstream function's arithmetic.
        local_only: needed only with megatron-core's local modules (not with Transformer Engine).
        applies: ``applies(model_config) -> bool``: whether this config reaches the sites.
        install: ``install(stack)``: installs the stand-in on ``stack`` (an ExitStack that restores it).
    """

    name: str
    replaces: str
    why: str
    sites: tuple[UpstreamSite, ...]
    applies: Callable
    install: Callable
    reimplements: tuple[tuple[str, str], ...] = ()
    local_only: bool = False

    def describe(self) -> str:
        return f"{self.name}: {self.replaces} ({', '.join(map(str, self.sites))})"


class SubstitutionMismatch(Exception):
    """An upstream line a stand-in names no longer reads as expected (another megatron version)."""


def patch_until(stack: contextlib.ExitStack, owner, attr: str, value) -> None:
    """Set ``owner.attr = value`` until ``stack`` closes (then the previous value, or no attribute, again)."""
    missing = object()
    previous = owner.__dict__.get(attr, missing) if isinstance(owner, type) else getattr(owner, attr, missing)
    setattr(owner, attr, value)

    def restore() -> None:
        if previous is missing:
            delattr(owner, attr)
        else:
            setattr(owner, attr, previous)

    stack.callback(restore)


def _at_sites(real: Callable, sites: tuple[UpstreamSite, ...], answer: Callable) -> Callable:
    """A function that returns ``answer(*args, **kwargs)`` when its direct caller is one of ``sites`` (file and line),
    and calls ``real`` otherwise."""
    where = {(str(site.file), site.line) for site in sites}

    def stand_in(*args, **kwargs):
        caller = sys._getframe(1)
        if (str(Path(caller.f_code.co_filename).resolve()), caller.f_lineno) in where:
            return answer(*args, **kwargs)
        return real(*args, **kwargs)

    stand_in.__name__ = getattr(real, "__name__", "stand_in")
    return stand_in


class _BuildStream:
    """Answers a CUDA stream's calls during construction (nothing runs on it)."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, *args, **kwargs) -> None:
        pass

    def wait_event(self, *args, **kwargs) -> None:
        pass

    def record_event(self, *args, **kwargs) -> None:
        return None

    def synchronize(self) -> None:
        pass


# --- the sites (megatron-core 0.19.2 / megatron-bridge 0.6.2) ------------------------------------------------------
_DISPATCHER_STREAM = (
    UpstreamSite("megatron/core/transformer/moe/token_dispatcher.py", 468,
                 "if MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is None:"),
    UpstreamSite("megatron/core/transformer/moe/token_dispatcher.py", 469,
                 "MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = torch.cuda.Stream()"),
)
_DDP_STREAM = (
    UpstreamSite("megatron/training/models/dist_utils.py", 303, "ddp_stream = torch.cuda.Stream()"),
    UpstreamSite("megatron/training/models/dist_utils.py", 304, "ddp_stream.wait_stream(torch.cuda.current_stream())"),
    UpstreamSite("megatron/training/models/dist_utils.py", 306, "with torch.cuda.stream(ddp_stream):"),
    UpstreamSite("megatron/training/models/dist_utils.py", 366, "torch.cuda.current_stream().wait_stream(ddp_stream)"),
)
_YARN_DEVICE = (  # MLA builds its YaRN embedding without use_cpu_initialization (multi_latent_attention.py:190)
    UpstreamSite("megatron/core/models/common/embeddings/yarn_rotary_pos_embedding.py", 76,
                 "device = 'cpu' if use_cpu_initialization else torch.cuda.current_device()"),
    UpstreamSite("megatron/core/models/common/embeddings/rotary_pos_embedding.py", 78,
                 "device = 'cpu' if use_cpu_initialization else torch.cuda.current_device()"),
    # YarnRotaryEmbedding.__init__ fills its cos/sin cache through get_emb, which moves CPU frequencies to the GPU
    UpstreamSite("megatron/core/models/common/embeddings/yarn_rotary_pos_embedding.py", 122,
                 "self.inv_freq_extra = self.inv_freq_extra.to(device=torch.cuda.current_device())"),
    UpstreamSite("megatron/core/models/common/embeddings/yarn_rotary_pos_embedding.py", 126,
                 "self.inv_freq_inter = self.inv_freq_inter.to(device=torch.cuda.current_device())"),
)
_ROUTER_BUFFERS = (  # the router's fp32 per-expert counters and expert bias (buffers, not parameters)
    UpstreamSite("megatron/core/transformer/moe/router.py", 184, "device=torch.cuda.current_device(),"),
    UpstreamSite("megatron/core/transformer/moe/router.py", 193, "device=torch.cuda.current_device(),"),
    UpstreamSite("megatron/core/transformer/moe/router.py", 207, "device=torch.cuda.current_device(),"),
    UpstreamSite("megatron/core/transformer/moe/router.py", 213,
                 "torch.tensor(0, dtype=torch.float32, device=torch.cuda.current_device()),"),
)
_DDP_BUFFERS = (
    UpstreamSite("megatron/core/distributed/param_and_grad_buffer.py", 1162, "device=torch.cuda.current_device(),"),
    UpstreamSite("megatron/core/distributed/param_and_grad_buffer.py", 1180, "device=torch.cuda.current_device(),"),
    UpstreamSite("megatron/core/distributed/param_and_grad_buffer.py", 1186, "device=torch.cuda.current_device(),"),
)
_ATTENTION_SINKS = (  # the local core attention's learnable softmax offsets (attention sinks): a parameter
    UpstreamSite("megatron/core/transformer/dot_product_attention.py", 132, "device=torch.cuda.current_device(),"),
)
_META_SITES = _YARN_DEVICE + _ROUTER_BUFFERS + _ATTENTION_SINKS + _DDP_BUFFERS
_CP_POS_EMB = (
    UpstreamSite("megatron/core/models/common/embeddings/rope_utils.py", 64, ").cuda(non_blocking=True)"),
    UpstreamSite("megatron/core/models/common/embeddings/yarn_rotary_pos_embedding.py", 186,
                 "emb = get_pos_emb_on_this_cp_rank(emb, 0, cp_group)"),
)
_NORM_SP = (
    UpstreamSite("megatron/core/transformer/torch_norm.py", 50,
                 'assert not config.sequence_parallel, f"sequence parallel not supported by torch LayerNorm"'),
)
_ATTENTION_CP = (
    UpstreamSite("megatron/core/transformer/dot_product_attention.py", 59,
                 '), "Context parallelism is only supported by TEDotProductAttention!"'),
)
_ATTENTION_KV_CHANNELS = (
    UpstreamSite("megatron/core/transformer/multi_latent_attention.py", 214, "k_channels=self.q_head_dim,"),
    UpstreamSite("megatron/core/transformer/multi_latent_attention.py", 215, "v_channels=self.config.v_head_dim,"),
)
_MTP_SPEC = (
    UpstreamSite("megatron/bridge/models/gpt_provider.py", 371, "use_transformer_engine=True,"),
    UpstreamSite("megatron/bridge/models/gpt_provider.py", 376,
                 "return get_gpt_mtp_block_spec(config, spec, use_transformer_engine=True, vp_stage=vp_stage)"),
)


def _meta_device(*args, **kwargs):
    import torch

    return torch.device("meta")


def _install_dispatcher_stream(stack: contextlib.ExitStack) -> None:
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    if MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is None:
        patch_until(stack, MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", _BuildStream())


def _install_ddp_stream(stack: contextlib.ExitStack) -> None:
    import torch

    stream, current, context, after = _DDP_STREAM
    patch_until(stack, torch.cuda, "Stream", _at_sites(torch.cuda.Stream, (stream,), _BuildStream))
    patch_until(stack, torch.cuda, "current_stream",
           _at_sites(torch.cuda.current_stream, (current, after), lambda *a, **k: _BuildStream()))
    patch_until(stack, torch.cuda, "stream", _at_sites(torch.cuda.stream, (context,), lambda *a, **k: contextlib.nullcontext()))


def _install_meta_device(stack: contextlib.ExitStack) -> None:
    import torch

    patch_until(stack, torch.cuda, "current_device",
           _at_sites(torch.cuda.current_device, _META_SITES, _meta_device))


def _pos_emb_on_this_cp_rank(pos_emb, seq_dim: int, cp_group):
    """megatron-core 0.19.2 ``rope_utils.get_pos_emb_on_this_cp_rank``'s selection -- this CP rank's two chunks
    (``cp_rank`` and ``2·CP - cp_rank - 1``) of the sequence -- with its index built on ``pos_emb``'s own device
    instead of a pinned CPU tensor moved to the GPU."""
    import torch

    if cp_group is None:
        raise ValueError("cp_group must be provided to get positional embedding per CP rank")
    cp_size, cp_rank = cp_group.size(), cp_group.rank()
    index = torch.tensor([cp_rank, 2 * cp_size - cp_rank - 1], device=pos_emb.device)
    pos_emb = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp_size, -1, *pos_emb.shape[seq_dim + 1:])
    pos_emb = pos_emb.index_select(seq_dim, index)
    return pos_emb.view(*pos_emb.shape[:seq_dim], -1, *pos_emb.shape[seq_dim + 2:])


def _install_cp_pos_emb(stack: contextlib.ExitStack) -> None:
    import megatron.core.models.common.embeddings.yarn_rotary_pos_embedding as yarn

    patch_until(stack, yarn, "get_pos_emb_on_this_cp_rank", _pos_emb_on_this_cp_rank)


def _install_norm_sp(stack: contextlib.ExitStack) -> None:
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    real = WrappedTorchNorm.__new__

    def __new__(cls, config, hidden_size, *args, **kwargs):
        if not config.sequence_parallel:
            return real(cls, config, hidden_size, *args, **kwargs)
        norm = real(cls, _replaced(config, sequence_parallel=False), hidden_size, *args, **kwargs)
        for param in norm.parameters():  # as TE's and Apex's norms mark their weights under sequence parallelism
            param.sequence_parallel = True
        return norm

    patch_until(stack, WrappedTorchNorm, "__new__", staticmethod(__new__))


def _install_attention_cp(stack: contextlib.ExitStack) -> None:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    real = DotProductAttention.__init__

    def __init__(self, config, *args, **kwargs):
        if config.context_parallel_size > 1:
            config = _replaced(config, context_parallel_size=1)
        real(self, config, *args, **kwargs)

    patch_until(stack, DotProductAttention, "__init__", __init__)


def _install_attention_kv_channels(stack: contextlib.ExitStack) -> None:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    real = DotProductAttention.__init__

    def __init__(self, config, *args, k_channels=None, v_channels=None, **kwargs):
        real(self, config, *args, **kwargs)

    patch_until(stack, DotProductAttention, "__init__", __init__)


def _install_mtp_spec(stack: contextlib.ExitStack) -> None:
    import megatron.core.models.gpt.gpt_layer_specs as specs

    real_mtp, real_layers = specs.get_gpt_mtp_block_spec, specs.get_gpt_decoder_layer_specs

    def get_gpt_mtp_block_spec(config, spec, use_transformer_engine, *args, **kwargs):
        local = getattr(config, "transformer_impl", None) == "local"
        return real_mtp(config, spec, False if local else use_transformer_engine, *args, **kwargs)

    def get_gpt_decoder_layer_specs(config, use_transformer_engine, *args, **kwargs):
        local = getattr(config, "transformer_impl", None) == "local"
        return real_layers(config, False if local else use_transformer_engine, *args, **kwargs)

    patch_until(stack, specs, "get_gpt_mtp_block_spec", get_gpt_mtp_block_spec)
    patch_until(stack, specs, "get_gpt_decoder_layer_specs", get_gpt_decoder_layer_specs)


def _replaced(config, **fields):
    """A shallow copy of a TransformerConfig with ``fields`` replaced (no ``__post_init__`` re-run)."""
    out = copy.copy(config)
    for key, value in fields.items():
        object.__setattr__(out, key, value)
    return out


def _yarn(m) -> bool:
    """YaRN positions (built with their cos/sin cache at construction): MLA's rope_type or GPT's embedding type."""
    if getattr(m, "multi_latent_attention", False):
        return getattr(m, "rope_type", "") == "yarn"
    return getattr(m, "position_embedding_type", "") == "yarn"


def _moe(m) -> bool:
    return bool(m.num_moe_experts)


SUBSTITUTIONS: tuple[Substitution, ...] = (
    Substitution(
        "dispatcher-stream", "the all-to-all dispatcher's shared device-to-host CUDA stream is a no-op stream",
        "a stream orders kernels; it holds no tensor (the class attribute is restored after the build)",
        _DISPATCHER_STREAM, lambda m: _moe(m) and m.moe_token_dispatcher_type == "alltoall",
        _install_dispatcher_stream),
    Substitution(
        "ddp-init-stream", "megatron DDP's initialisation stream (torch.cuda.Stream / current_stream / stream) is a "
        "no-op stream, at those lines only", "DDP builds its buffers in that stream's context; no tensor lives "
        "on it", _DDP_STREAM, lambda m: True, _install_ddp_stream),
    Substitution(
        "meta-device", "torch.cuda.current_device() answers the meta device at these lines only: the RoPE / YaRN "
        "frequency and cos/sin caches, the router's per-expert buffers, the local core attention's softmax offsets "
        "(attention sinks), DDP's parameter and gradient buffers",
        "the same shapes and dtypes are allocated on the meta device (no memory), as get_model("
        "init_model_with_meta_device=True) does for the weights", _META_SITES, lambda m: True, _install_meta_device),
    Substitution(
        "cp-pos-emb", "rope_utils.get_pos_emb_on_this_cp_rank builds its index on the embedding's device instead of a "
        "pinned CPU tensor moved with .cuda()", "the same two sequence chunks are selected; the RoPE cache is a buffer "
        "recomputed at run time, not a weight", _CP_POS_EMB,
        lambda m: (m.context_parallel_size or 1) > 1 and _yarn(m), _install_cp_pos_emb,
        reimplements=(("megatron.core.models.common.embeddings.rope_utils:get_pos_emb_on_this_cp_rank",
                       "ab7c5cb71dce22a9"),)),
    Substitution(
        "local-norm-sp", "megatron-core's torch norm (no TE, no Apex) is built under sequence parallelism, its weight "
        "marked sequence_parallel as TE's and Apex's norms mark it", "sequence parallelism splits activations, not the "
        "hidden-size norm weight", _NORM_SP, lambda m: bool(m.sequence_parallel), _install_norm_sp, local_only=True),
    Substitution(
        "local-attention-cp", "megatron-core's local DotProductAttention is built as if context_parallel_size were 1",
        "core attention holds no weight (only its forward would differ: the CP ring is TE's)", _ATTENTION_CP,
        lambda m: (m.context_parallel_size or 1) > 1, _install_attention_cp, local_only=True),
    Substitution(
        "local-attention-kv-channels", "megatron-core's local DotProductAttention ignores the k_channels / v_channels "
        "MLA passes (only TE's DotProductAttention takes them)", "core attention holds no weight",
        _ATTENTION_KV_CHANNELS, lambda m: bool(getattr(m, "multi_latent_attention", False)),
        _install_attention_kv_channels, local_only=True),
    Substitution(
        "local-mtp-spec", "megatron-bridge's mtp_block_spec asks for Transformer Engine MTP layer specs; with local "
        "modules they are megatron-core's local specs", "the MTP layer has the same norms, projection and "
        "transformer layer either way (TE fuses a norm into the next linear layer: the same weight)", _MTP_SPEC,
        lambda m: bool(m.mtp_num_layers), _install_mtp_spec, local_only=True),
)


def needed(model_config, local: bool) -> list[Substitution]:
    """The substitutions a build of ``model_config`` (a finalized provider) uses; ``local``: megatron-core's local
    modules (Transformer Engine absent)."""
    return [s for s in SUBSTITUTIONS if (local or not s.local_only) and s.applies(model_config)]


def mismatches(substitutions: list[Substitution]) -> list[str]:
    """One line per named upstream line whose installed text differs, or re-implemented function whose source hash
    differs ([] when every stand-in still matches the installed code)."""
    out = []
    for sub in substitutions:
        for site in sub.sites:
            found = site.installed_text()
            if found != site.text:
                out.append(f"{sub.name}: {site} reads {found!r}, expected {site.text!r}")
        for qualified, expected in sub.reimplements:
            got = function_hash(qualified)
            if got != expected:
                out.append(f"{sub.name}: {qualified} source hash {got}, expected {expected}")
    return out


@contextlib.contextmanager
def installed(substitutions: list[Substitution]) -> Iterator[None]:
    """Install ``substitutions`` for the duration of the block; everything is restored on exit.

    Raises:
        SubstitutionMismatch: an upstream line or function they stand in for changed (another megatron version).
    """
    problems = mismatches(substitutions)
    if problems:
        raise SubstitutionMismatch("; ".join(problems))
    with contextlib.ExitStack() as stack:
        for sub in substitutions:
            sub.install(stack)
        yield
