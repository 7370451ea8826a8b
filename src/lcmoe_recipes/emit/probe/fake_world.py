"""One rank of a full-size job in one process: torch.distributed without the other ranks.

Two backends, both registered with ``torch.distributed.Backend.register_backend`` and torn down with the world:

* ``fake`` -- torch's own (``torch.testing._internal.distributed.fake_pg``), as Megatron-LM's
  ``--fake-process-group``: no collective touches a tensor. Enough to *build* a model (nothing is communicated):
  :mod:`lcmoe_recipes.emit.probe.build`.
* ``mirror`` (:class:`MirrorBackend`, ours) -- for *running* one rank: every other rank is taken to be a copy of this
  one, so each collective returns what it would return among identical ranks, without communicating:

  - all-gather: every slot holds this rank's input;
  - all-reduce, reduce-scatter: this rank's own values (the mean of identical contributions; a sum would multiply
    activations by TP at every tensor-parallel layer and overflow);
  - all-to-all: from every peer, what this rank sends to itself -- so an MoE layer receives, per peer, exactly the
    tokens this rank routes to its own experts; with ``moe_router_force_load_balancing`` (random router logits,
    megatron-core 0.19.2 ``transformer/moe/router.py:856``) that is the balanced share, and the token counts the
    dispatcher all-gathers first agree with it (megatron-core ``token_dispatcher.py``, ``preprocess``);
  - broadcast: unchanged (the root is a copy); send: nothing; receive: zeros (a pipeline stage receives zero
    activations and gradients of the right shape); barrier: nothing.

  Memory is what this rank allocates for tensors of the shapes the real job has; values are not the real job's.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

MIRROR = "mirror"


def _done(result=None):
    import torch.futures
    from torch._C._distributed_c10d import _create_work_from_future

    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _mirror_class():
    """:class:`MirrorBackend`, defined on first use (it subclasses a torch class: no torch import at module load)."""
    from torch._C._distributed_c10d import Backend

    class MirrorBackend(Backend):
        """torch.distributed backend for one rank among copies of itself (module doc: the semantics)."""

        def __init__(self, rank: int, size: int) -> None:
            super().__init__(rank, size)
            self._rank, self._size = rank, size

        def getBackendName(self) -> str:  # noqa: N802 -- torch's name
            return MIRROR

        @property
        def supports_coalescing(self) -> bool:
            return False

        def size(self) -> int:
            return self._size

        # gathers: every slot is this rank's input
        def all_gather_single(self, output, input, opts=None):  # noqa: A002 -- torch's names
            output.copy_(input.reshape(1, -1).expand(self._size, -1).reshape(output.shape))
            return _done(output)

        def all_gather_single_coalesced(self, outputs, inputs, opts=None):
            for output, input in zip(outputs, inputs):  # noqa: A001
                self.all_gather_single(output, input)
            return _done(outputs)

        def allgather(self, output_lists, inputs, opts=None):
            for outputs, input in zip(output_lists, inputs):  # noqa: A001
                for output in outputs:
                    output.copy_(input)
            return _done(output_lists)

        def gather(self, output_lists, inputs, opts=None):
            return self.allgather(output_lists, inputs)

        # reductions: this rank's own values
        def allreduce(self, tensors, opts=None):
            return _done(tensors)

        def allreduce_coalesced(self, tensors, opts=None):
            return _done(tensors)

        def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
            output.copy_(input.reshape(self._size, -1)[self._rank].reshape(output.shape))
            return _done(output)

        def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
            for output, input in zip(outputs, inputs):  # noqa: A001
                self.reduce_scatter_single(output, input)
            return _done(outputs)

        def reduce_scatter(self, outputs, input_lists, opts=None):
            for output, inputs in zip(outputs, input_lists):
                output.copy_(inputs[self._rank])
            return _done(outputs)

        def scatter(self, outputs, input_lists, opts=None):
            return self.reduce_scatter(outputs, input_lists or [[o] * self._size for o in outputs])

        # all-to-all: from every peer, what this rank sends to itself
        def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):  # noqa: A002
            sizes_in = list(input_splits) or [input.shape[0] // self._size] * self._size
            sizes_out = list(output_splits) or [output.shape[0] // self._size] * self._size
            own = input.split(sizes_in)[self._rank]
            for chunk, size in zip(output.split(sizes_out), sizes_out):
                if size == own.shape[0]:
                    chunk.copy_(own)
                else:  # counts this rank did not mirror: the right shape, zeros
                    chunk.zero_()
            return _done(output)

        def alltoall(self, outputs, inputs, opts=None):
            for output in outputs:
                output.copy_(inputs[self._rank])
            return _done(outputs)

        # the rest: the root is a copy; nothing to send; zeros received
        def broadcast(self, tensors, opts=None):
            return _done(tensors)

        def barrier(self, opts=None):
            return _done()

        def send(self, tensors, dst, tag):
            return _done()

        def recv(self, tensors, src, tag):
            for tensor in tensors:
                tensor.zero_()
            return _done(tensors)

        def recv_anysource(self, tensors, tag):
            return self.recv(tensors, -1, tag)

    return MirrorBackend


_registered = False


def register_mirror_backend() -> None:
    """Register the ``mirror`` backend with torch.distributed (once; CPU and CUDA tensors)."""
    global _registered
    if _registered:
        return
    import torch.distributed as dist

    mirror = _mirror_class()
    dist.Backend.register_backend(MIRROR, lambda store, rank, size, timeout: mirror(rank, size),
                                  devices=["cpu", "cuda"])
    _registered = True


def init_world(world_size: int, rank: int, backend: str) -> None:
    """torch.distributed as ``rank`` of ``world_size`` on ``backend`` ("fake" or "mirror"), with a store that
    answers every key (no rendezvous)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake" too

    if backend == MIRROR:
        register_mirror_backend()
    dist.init_process_group(backend, store=FakeStore(), rank=rank, world_size=world_size)


@contextlib.contextmanager
def fake_world(world_size: int, rank: int, backend: str = "fake") -> Iterator[None]:
    """:func:`init_world` for the block; torch.distributed and megatron-core's process groups torn down on exit.

    Raises:
        LcmoeError: torch.distributed is already initialised in this process (it is not this block's to tear down).
    """
    import torch.distributed as dist

    from ...errors import LcmoeError

    if dist.is_initialized():
        raise LcmoeError("torch.distributed is already initialised in this process, so it cannot stand up a world "
                         "of its own", "run this in a process of its own (e.g. python -m lcmoe_recipes.check CONFIG "
                         "--build)")
    init_world(world_size, rank, backend)
    try:
        yield
    finally:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
