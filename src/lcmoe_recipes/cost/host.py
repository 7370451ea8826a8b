"""Host (CPU) memory per node of a Plan, in bytes: each rank's data loaders, its CPU-offloaded optimizer state, its
pinned buffers and its process, summed over the ranks one node hosts; the most loaded node is reported.

A node is ``Hardware.gpus_per_node`` consecutive global ranks (torchrun and Slurm fill nodes in rank order); its RAM
is ``Hardware.host_memory_bytes``. The terms, per rank:

* **data loader** -- megatron-bridge 0.6.2 builds the dataset and a torch ``DataLoader`` on *every* rank
  (``data/utils.py``, ``pretrain_train_valid_test_datasets_provider`` hands megatron-core's
  ``BlendedMegatronDatasetBuilder`` ``lambda: True``, "Build the dataset on all ranks for TP-replicated loading";
  ``is_dataset_built_on_rank`` exists there but nothing calls it): one loader for training and, when
  ``validation.eval_iters > 0``, one each for validation and test (``data/loaders.py``,
  ``build_train_valid_test_data_loaders``). Each has ``dataset.num_workers`` worker processes, each keeping torch's
  default ``prefetch_factor`` of :data:`PREFETCH_FACTOR` batches in flight (``samplers.py``,
  ``build_pretraining_data_loader``, passes none). A sample of megatron-core 0.19.2's ``GPTDataset.__getitem__``
  carries tokens and labels (int64), ``loss_mask`` (float32) and ``position_ids`` (int64) -- :data:`TOKEN_BYTES`
  per token -- and, with ``create_attention_mask``, a bool (1, s, s) causal mask. ``_get_ltor_masks_and_position_ids``
  builds that mask as ``torch.tril(torch.ones((s, s)))``: two float32 s x s tensors alive at once
  (:data:`MASK_BUILD_BYTES` per element), then casts it to bool (``< 0.5``, 1 byte per element) and the dataset
  caches the bool mask in each worker (positions and masks are not reset per document). A worker's peak is the
  larger of that build and its steady state (cached mask + its prefetched collated batches, in shared memory until
  the main process copies them to pinned memory); the rank's main process holds the batch the step reads and the
  one being pinned. Every worker is counted at its own peak: an upper bound (the train and test workers of
  ``dataloader_type="single"`` loaders do start, and build their first masks, together at setup; the validation
  workers start at the first evaluation). A worker's own process costs little: forked from the rank, it shares the
  rank's pages (measured below).
* **offloaded optimizer** -- with ``optimizer_cpu_offload``, megatron-core 0.19.2's ``HybridDeviceOptimizer``
  (``optimizer/cpu_offloading/hybrid_optimizer.py``, built with ``param_update_in_fp32=True`` by
  ``optimizer/__init__.py``) moves ``optimizer_offload_fraction`` of the rank's distributed-optimizer shard (the
  elements :func:`lcmoe_recipes.cost.memory.rank_memory` reports as ``optimizer_shard_params``) to the CPU and runs
  ``torch.optim.AdamW`` there: per element an fp32 master weight (4 bytes), two fp32 Adam moments (8) and an fp32
  copy of the gradient (4) -- 16 bytes, whatever the GPU-side moment dtypes (the precision-aware optimizer's bf16
  moments apply to the GPU part only).
* **pinned** -- the part of those 16 bytes in page-locked memory: the gradient copies when ``pin_cpu_grads``
  (``torch.empty(..., pin_memory=True)``), and the fp32 master weights when the optimizer is not precision-aware
  (``_get_sub_optimizer_param_groups`` always calls ``.pin_memory()`` on the copy: ``pin_cpu_params`` is stored but
  never read in 0.19.2; with the precision-aware optimizer that pinned copy is the bf16 shard, dropped at once for
  an fp32 pageable copy, and torch's pinned cache reuses its block for the next parameter of the same size). torch's
  ``CachingHostAllocator`` rounds every pinned allocation up to a power of two (torch 2.14
  ``ATen/core/CachingHostAllocator.h``, ``PowerOf2Ceil``); one allocation is one parameter's shard, whose size is
  taken as a routed expert's weight (``moe_intermediate_size`` x ``hidden_size`` times a power of two): the bulk of
  an MoE's parameters.
* **checkpoint** -- our configs save asynchronously (``checkpoint.async_save``, :mod:`lcmoe_recipes.cost.wallclock`):
  each rank copies its share of a save to host memory and a background process writes it (megatron-core 0.19.2
  ``dist_checkpointing/strategies/filesystem_async.py``, ``preload_tensors``), so during a save a node holds its
  ranks' shares (:func:`lcmoe_recipes.cost.wallclock.rank_save_bytes`: the optimizer shard and the same share of the
  weights; offloaded optimizer state is on the host already). Priced for every plan: a config that saves
  synchronously needs less.
* **processes** -- :data:`RANK_PROCESS_BYTES` per rank (Python, torch, megatron-bridge, the CUDA context).

Host *time* -- what CPU Adam under optimizer offload adds to a step -- is :mod:`lcmoe_recipes.cost.offload`.

Not counted: the OS and the file system's page cache (the dataset's ``.bin``/``.idx`` files and index arrays are
memory-mapped, so they are shared and reclaimable), NCCL / InfiniBand registration buffers.
The planning fraction :data:`HOST_MARGIN` leaves room for them. Imports neither torch nor megatron.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.plan import Plan
from .offload import node_stages, offload_elements
from .shapes import shapes
from .wallclock import rank_save_bytes

HOST_MARGIN = 0.85  # plan to at most 85% of a node's RAM: the OS, page cache, NCCL/IB buffers live outside the model

PREFETCH_FACTOR = 2  # torch.utils.data.DataLoader's default when num_workers > 0 (torch 2.14 dataloader.py)
# tokens + labels (int64), loss_mask (float32), position_ids (int64): megatron-core 0.19.2 GPTDataset.__getitem__
TOKEN_BYTES = 8 + 8 + 4 + 8
MASK_BYTES = 1        # the bool mask the dataset keeps, per element of s x s
# torch.tril(torch.ones((s, s))): two float32 tensors alive at once. Measured by scripts/measure_host_memory.py:
# peak RSS growth 8.02 bytes per element at s = 8192 (torch 2.14.1, megatron-core 0.19.2, 2026-12-01).
MASK_BUILD_BYTES = 4 + 4
CPU_MASTER_BYTES = 4   # fp32 master weight (param_update_in_fp32)
CPU_MOMENT_BYTES = 8   # Adam exp_avg and exp_avg_sq, fp32 like the master (torch.optim.AdamW's state)
CPU_GRAD_BYTES = 4     # fp32 gradient copy (HybridDeviceOptimizer._set_sub_optimizer_grads)
# One rank's own process. Measured by scripts/measure_host_memory.py (2026-12-01, light environment, no GPU):
# 0.61-0.76 GiB unique memory (USS, lower when other processes map the same libraries) after importing torch 2.14.1
# and megatron-bridge 0.6.2 with its training modules; a forked data-loader worker adds 0.01 GiB. The CUDA context's
# host allocations cannot be measured without a GPU: pytorch/pytorch#12873 measured ~1.1 GiB of host RSS at a
# process's first CUDA operation. Assumed: 2 GiB per rank (0.76 + 1.1, rounded up).
RANK_PROCESS_BYTES = 2 * 2**30


@dataclass(frozen=True)
class HostMemoryBreakdown:
    """Host bytes on one node, by term; ``total`` is their sum.

    Attributes:
        node: index of the node (ranks ``node * gpus_per_node`` onwards).
        ranks: ranks (GPUs) on that node.
        data_loader: data-loader workers and the ranks' batches (bytes).
        optimizer: pageable CPU-offloaded optimizer state (bytes).
        pinned: page-locked optimizer buffers, power-of-two rounding included (bytes).
        checkpoint: the ranks' shares of an asynchronous save while it is written (bytes).
        processes: the ranks' own processes (bytes).
        detail: per-rank and per-sample figures behind the terms (bytes, counts).
    """

    node: int
    ranks: int
    data_loader: float
    optimizer: float
    pinned: float
    processes: float
    checkpoint: float = 0.0
    detail: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def total(self) -> float:
        return self.data_loader + self.optimizer + self.pinned + self.checkpoint + self.processes

    def gib(self) -> dict[str, float]:
        """Terms in GiB (2**30 bytes)."""
        names = ("data_loader", "optimizer", "pinned", "checkpoint", "processes", "total")
        return {n: getattr(self, n) / 2**30 for n in names}


def data_loaders(plan: Plan) -> int:
    """DataLoaders megatron-bridge 0.6.2 builds per rank: train, plus validation and test when ``eval_iters > 0``."""
    return 1 + (2 if plan.eval_iters > 0 else 0)


def sample_bytes(plan: Plan) -> int:
    """Host bytes of one collated sample: :data:`TOKEN_BYTES` per token plus the s x s bool mask when created."""
    s = plan.seq_length
    return s * TOKEN_BYTES + (s * s * MASK_BYTES if plan.create_attention_mask else 0)


def loader_bytes_per_rank(plan: Plan) -> dict[str, float]:
    """A rank's data-loader bytes: ``worker`` (one worker's peak), ``main`` (the rank's own batches), ``total``."""
    s, batch = plan.seq_length, plan.micro_batch_size * sample_bytes(plan)
    mask = plan.create_attention_mask
    if plan.num_workers > 0:
        steady = (s * s * MASK_BYTES if mask else 0) + PREFETCH_FACTOR * batch
        worker = max(s * s * MASK_BUILD_BYTES if mask else 0, steady)
        main = 2 * batch  # the batch the step reads, the next one being copied to pinned memory
    else:  # the rank's main process builds its samples itself
        worker = 0.0
        main = max(s * s * MASK_BUILD_BYTES if mask else 0, (s * s * MASK_BYTES if mask else 0) + 2 * batch)
    workers = data_loaders(plan) * plan.num_workers
    return {"worker": float(worker), "main": float(main), "total": float(workers * worker + main)}


def pinned_rounding(plan: Plan) -> float:
    """torch's pinned allocator rounds each allocation up to a power of two: bytes held per byte asked, for one
    routed expert's weight (``moe_intermediate_size`` x ``hidden_size``; ETP and the fc1 gate+up factor are powers
    of two and do not change the ratio). DeepSeek-V3: 7168 x 2048 -> 8/7. A dense model: its MLP weight
    (``intermediate_size`` x ``hidden_size``)."""
    s = shapes(plan.model_spec)
    elements = s.h * (s.f_expert or s.f_dense)
    return (1 << (elements - 1).bit_length()) / elements


def optimizer_bytes_per_rank(plan: Plan, pp_rank: int) -> tuple[float, float]:
    """(pageable, pinned) host bytes of one rank's CPU-offloaded optimizer state on pipeline rank ``pp_rank``."""
    if not plan.optimizer_cpu_offload or plan.optimizer_offload_fraction <= 0:
        return 0.0, 0.0
    elements = offload_elements(plan, pp_rank)
    pinned = ((CPU_GRAD_BYTES if plan.pin_cpu_grads else 0)
              + (0 if plan.use_precision_aware_optimizer else CPU_MASTER_BYTES))
    pageable = CPU_MASTER_BYTES + CPU_MOMENT_BYTES + CPU_GRAD_BYTES - pinned
    return elements * pageable, elements * pinned * pinned_rounding(plan)


def estimate_host_memory(plan: Plan) -> HostMemoryBreakdown:
    """Host memory of the most loaded node of ``plan`` (see the module doc)."""
    lay, per_node = plan.layout, plan.hardware_spec.gpus_per_node
    world, pp = lay.world, lay.pp
    loader = loader_bytes_per_rank(plan)
    by_stage = [optimizer_bytes_per_rank(plan, p) for p in range(pp)]
    saves = [rank_save_bytes(plan, p) for p in range(pp)]
    nodes = node_stages(world, pp, per_node)
    detail = {"sample_bytes": float(sample_bytes(plan)), "loader_worker_bytes": loader["worker"],  # per rank: the
              "loader_main_bytes": loader["main"], "loaders_per_rank": float(data_loaders(plan)),  # same on every node
              "workers_per_rank": float(data_loaders(plan) * plan.num_workers),
              "pinned_rounding": pinned_rounding(plan)}
    best = None
    for n, stages in nodes.items():  # the terms of each kind of node; the breakdown of the first most loaded one
        ranks = len(stages)
        terms = (ranks * loader["total"], sum(by_stage[p][0] for p in stages), sum(by_stage[p][1] for p in stages),
                 ranks * RANK_PROCESS_BYTES, sum(saves[p] for p in stages))
        data_loader, optimizer, pinned, processes, checkpoint = terms
        total = data_loader + optimizer + pinned + checkpoint + processes  # HostMemoryBreakdown.total
        if best is None or total > best[0]:
            best = (total, n, ranks, terms)
    _, n, ranks, (data_loader, optimizer, pinned, processes, checkpoint) = best
    return HostMemoryBreakdown(node=n, ranks=ranks, data_loader=data_loader, optimizer=optimizer, pinned=pinned,
                               processes=processes, checkpoint=checkpoint, detail=detail)


