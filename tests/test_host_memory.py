"""Host (CPU) memory per node: hand-computed terms, the check that refuses a node's RAM overflow, and the planner.

Model numbers are DeepSeek-V3's config.json (src/lcmoe_recipes/catalog/hf_configs/deepseek_v3.json); node RAM is the
hardware catalogue's (DGX H100: 2 TB; GB200 compute tray: 2 x 480 GB).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lcmoe_recipes import NAMED_RECIPES, recipe_plan
from lcmoe_recipes.catalog import hardware as hardware_catalog
from lcmoe_recipes.checks.memory import host_findings
from lcmoe_recipes.cost import HOST_MARGIN, estimate_host_memory
from lcmoe_recipes.cost.host import (MASK_BUILD_BYTES, MASK_BYTES, RANK_PROCESS_BYTES, loader_bytes_per_rank,
                                     optimizer_bytes_per_rank, pinned_rounding, sample_bytes)
from lcmoe_recipes.cost.offload import CPU_ADAM_BYTES, CPU_COPY_BYTES, offload_step_seconds
from lcmoe_recipes.cost.step import estimate_step
from lcmoe_recipes.report.explain import explain_json, explain_text
from scripts_loader import load_script

GIB = 2**30
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def small_ram_h100(monkeypatch):
    """The catalogue's H100 with 64 GB of host memory per node (for this test only)."""
    small = dataclasses.replace(hardware_catalog.get_hardware("h100"), display="H100 with 64 GB RAM",
                                host_memory_bytes=64 * 10**9)
    monkeypatch.setitem(hardware_catalog.HARDWARE, "h100", small)
    return small


def test_cpu_adam_time_dsv3_128k_h100():
    """Optimizer CPU offload's step time from the elements a node holds and its host memory bandwidth.

    DGX H100: two Xeon 8480C, 8 DDR5-4800 channels each: 16 x 4.8 GT/s x 8 B = 614.4 GB/s (Intel ARK); each GPU on
    PCIe Gen5 x16, 64 GB/s per direction (H100 datasheet). The busiest node holds 8 ranks of PP rank 6, each
    2,876,821,504 + 7168/32 offloaded elements (test above)."""
    plan = recipe_plan("dsv3_128k_h100")
    assert CPU_ADAM_BYTES == 28 and CPU_COPY_BYTES == 4  # fp32 param, grad, m, v read; param, m, v written
    hw = plan.hardware_spec
    assert (hw.host_memory_gbps, hw.host_link_gbps) == (614.4, 64.0)
    rank = 2_876_821_504 + 7168 // 32
    t = offload_step_seconds(plan)
    assert (t.node, t.rank_elements, t.node_elements) == (24, rank, 8 * rank)
    assert t.host_memory == pytest.approx(8 * rank * 36 / 614.4e9) == pytest.approx(1.349, abs=1e-3)
    assert t.d2h == t.h2d == pytest.approx(rank * 4 / 64e9) == pytest.approx(0.180, abs=1e-3)
    assert t.seconds == t.host_memory  # the copies pipeline behind the updates (overlap_cpu_optimizer_d2h_h2d)
    assert estimate_step(plan).parts["optimizer_offload"] == t.seconds
    half = offload_step_seconds(plan.with_changes(optimizer_offload_fraction=0.5))
    assert half.seconds == pytest.approx(t.seconds / 2, rel=1e-3)  # linear in the offloaded elements
    # GB200 tray: two Grace CPUs at 500 GB/s each (Grace CPU Superchip datasheet), NVLink-C2C 225 GB/s per GPU
    gb = recipe_plan("qwen3_235b_128k_gb200").with_changes(optimizer_cpu_offload=True, optimizer_offload_fraction=1.0)
    g = offload_step_seconds(gb)
    assert gb.hardware_spec.gpus_per_node == 4 and g.node_elements == 4 * g.rank_elements
    assert g.host_memory == pytest.approx(g.node_elements * 36 / 1000e9)
    assert g.d2h == pytest.approx(g.rank_elements * 4 / 225e9)
    # TP4 PP4 CP4 EP32: a stage's 24 MoE layers x 4 local experts x 3 x 4096 x 1536 (EDP 1) + 3% dense share
    assert g.rank_elements == pytest.approx(24 * 4 * 3 * 4096 * 1536, rel=0.04)
    assert g.seconds == pytest.approx(0.269, abs=1e-3)  # 4 x 1.87e9 elements x 36 B / 1,000 GB/s
    assert offload_step_seconds(plan.with_changes(optimizer_cpu_offload=False)).seconds == 0.0


def test_cpu_adam_needs_host_bandwidth(monkeypatch):
    """A hardware entry without host bandwidths cannot price offload: the error names the fields to add."""
    bare = dataclasses.replace(hardware_catalog.get_hardware("h100"), host_memory_gbps=0.0)
    monkeypatch.setitem(hardware_catalog.HARDWARE, "h100", bare)
    plan = recipe_plan("dsv3_128k_h100").with_changes(optimizer_offload_fraction=0.75)
    with pytest.raises(ValueError, match="host_memory_gbps and host_link_gbps"):
        offload_step_seconds(plan)


def test_attention_mask_bytes_at_128k_and_256k():
    plan = recipe_plan("dsv3_128k_h100").with_changes(create_attention_mask=True, num_workers=2)
    s = 131072  # 2**17: the mask has 2**34 elements
    assert sample_bytes(plan) == 2**34 + 28 * s  # bool mask + tokens, labels, position_ids (int64), loss_mask (fp32)
    worker = loader_bytes_per_rank(plan)["worker"]
    assert worker == 128 * GIB  # torch.ones + torch.tril: two float32 s x s tensors = 2 x 64 GiB
    # The "~64 GiB + 16 GiB per sample at 128K" is the float32 mask and its bool cast (80 GiB); the peak is
    # earlier, while tril's float32 output and its float32 input are both alive: 128 GiB per worker.
    assert 64 * GIB + 16 * GIB < worker
    assert loader_bytes_per_rank(plan)["main"] == 2 * (2**34 + 28 * s)  # the step's batch + the one being pinned
    at_256k = plan.with_changes(seq_length=262144)
    assert sample_bytes(at_256k) == 2**36 + 28 * 262144  # 64 GiB bool mask per sample
    assert loader_bytes_per_rank(at_256k)["worker"] == 512 * GIB == 4 * worker  # "~4x that at 256K" holds
    # train, validation and test loaders (eval_iters > 0), 2 workers each, on each of a node's 8 ranks
    host = estimate_host_memory(plan)
    assert host.data_loader == 8 * (6 * 128 * GIB + 2 * (2**34 + 28 * s))
    assert loader_bytes_per_rank(plan.with_changes(create_attention_mask=False))["worker"] == 2 * 28 * s


def test_offloaded_optimizer_dsv3_128k_h100_per_node():
    plan = recipe_plan("dsv3_128k_h100")  # TP1 CP32 EP32 PP8 VPP4, precision-aware optimizer, offload fraction 1.0
    # PP ranks 2-6 each hold 8 MoE layers (4 chunks of 2 layers): the largest shard. Per layer:
    h, f, experts = 7168, 2048, 256
    expert_layer = experts * 3 * h * f                                      # 11,274,289,152 routed-expert params
    q = h * 1536 + 1536 * 128 * (128 + 64) + 1536                           # MLA q_down, q_up, q norm
    kv = h * (512 + 64) + 512 + 512 * 128 * (128 + 128)                     # kv_down, kv norm, kv_up
    dense_layer = q + kv + 128 * 128 * h + 3 * h * f + h * experts + 2 * h  # + o_proj, shared expert, router, norms
    shard = 8 * dense_layer // 32 + 8 * expert_layer // 32                  # dense / (DP·CP = 32), experts / EP 32
    assert shard == 2_876_821_504
    pageable, pinned = optimizer_bytes_per_rank(plan, 2)
    assert pageable == shard * 12  # fp32 master + two fp32 Adam moments
    assert pinned == pytest.approx(shard * 4 * 8 / 7)  # fp32 gradient copy, pinned: 7168 x 2048 rounds up by 8/7
    host = estimate_host_memory(plan)
    # PP rank 6 also holds the decoder's final norm (with MTP layers megatron-core puts it with the last decoder
    # layer): h more dense params, /32 per rank -- the most loaded, by 224 params
    assert (host.node, host.ranks) == (24, 8)  # the first node of PP rank 6 (32 ranks = 4 nodes per stage)
    assert host.optimizer == 8 * (shard + h // 32) * 12 == 276_174_885_888  # 257.2 GiB
    assert host.pinned == pytest.approx(105_209_472_146)        # 98.0 GiB
    assert host.processes == 8 * RANK_PROCESS_BYTES
    assert host.total < HOST_MARGIN * 2 * 10**12  # fits a DGX H100's 2 TB
    assert optimizer_bytes_per_rank(plan.with_changes(pin_cpu_grads=False), 2) == (shard * 16, 0)
    not_aware = optimizer_bytes_per_rank(plan.with_changes(use_precision_aware_optimizer=False), 2)
    assert not_aware == (shard * 8, pytest.approx(shard * 8 * 8 / 7))  # fp32 masters pinned too


def test_pinned_rounding_from_expert_shapes():
    assert pinned_rounding(recipe_plan("dsv3_128k_h100")) == 8 / 7               # 7168 x 2048
    assert pinned_rounding(recipe_plan("qwen3_235b_128k_gb200")) == 4 / 3        # 4096 x 1536
    assert pinned_rounding(recipe_plan("qwen3_next_8k_gb200")) == 1.0            # 2048 x 512


@pytest.mark.parametrize("name", NAMED_RECIPES)
def test_named_recipes_fit_without_the_mask_and_not_with_it_at_128k(name):
    plan = recipe_plan(name).with_changes(create_attention_mask=False)
    hw = plan.hardware_spec
    assert estimate_host_memory(plan).total < HOST_MARGIN * hw.host_memory_bytes
    assert not [f for f in host_findings(plan) if f.severity == "error"]
    masked = host_findings(plan.with_changes(create_attention_mask=True))
    if plan.seq_length >= 131072:
        assert masked[0].rule == "host-memory/exceeds-ram"
        assert "dataset.create_attention_mask=false" in masked[0].fix


def test_nodes_spanning_pipeline_stages():
    plan = recipe_plan("qwen3_next_8k_gb200")  # 32 GB200: PP2, 16 ranks per stage, 4 ranks per tray
    layout = dataclasses.replace(plan.layout, world=8, pp=4, ep=2, vpp=None)  # 2 ranks per stage: a tray spans two
    small = plan.with_changes(layout=layout, pipeline_model_parallel_layout=None, global_batch_size=8,
                              optimizer_cpu_offload=True, optimizer_offload_fraction=0.5)
    host = estimate_host_memory(small)
    trays = [sum(optimizer_bytes_per_rank(small, rank * 4 // 8)[0] for rank in ranks)  # PP rank = rank // 2
             for ranks in ((0, 1, 2, 3), (4, 5, 6, 7))]
    assert host.ranks == 4 and host.optimizer == max(trays) > 0


def test_cpu_oversubscription_is_a_warning():
    # megatron-bridge's DSV3 recipe: 8 workers per loader -> 8 x (1 + 8) = 72 busy processes on 112 cores
    assert host_findings(recipe_plan("dsv3_128k_h100")) == []
    plan = recipe_plan("dsv3_128k_h100").with_changes(num_workers=16)  # 8 x (1 + 16) = 136 busy processes
    found = host_findings(plan)
    assert [(f.severity, f.rule) for f in found] == [("warning", "host/cpu-oversubscribed")]
    assert "136 busy processes per node on H100 SXM5 80GB (HGX)'s 112 CPU cores" in found[0].message
    assert found[0].fix == "lower dataset.num_workers to 13"


def test_check_prints_host_memory_beside_gpu_memory(capsys):
    from lcmoe_recipes.cli.check import main

    assert main(["dsv3_128k_h100"]) == 0
    out = capsys.readouterr().out
    assert ("host memory per node (node 24, 8 ranks, the most loaded), GiB: data_loader 1.4, optimizer 257.2, "
            "pinned 98.0, checkpoint 42.9, processes 16.0 = 415.4 of 1863") in out


def test_small_ram_system_refused_by_check(small_ram_h100, capsys):
    from lcmoe_recipes.cli.check import main

    assert main(["dsv3_128k_h100"]) == 1
    out = capsys.readouterr().out
    assert ("error   host-memory/exceeds-ram: predicted host memory 415 GiB on node 24 (8 ranks) exceeds 85% of H100 "
            "with 64 GB RAM's 60 GiB per node (optimizer 257, pinned 98, checkpoint 43, processes 16, data loader 1 "
            "GiB)") in out
    assert ("        fix: offload less optimizer state (a smaller optimizer.optimizer_offload_fraction) or use more "
            "nodes (a larger DP/EDP shards it thinner); save synchronously (checkpoint.async_save=false: training "
            "waits for each write) or use more nodes (each rank's share of a save is smaller)\n") in out


def test_planner_avoids_plans_that_overflow_host_ram(monkeypatch):
    from lcmoe_recipes.planner.search import search_layouts as search
    from lcmoe_recipes.core.request import TrainingRequest

    # a quarter of HBM kept free: the winner with FP32 gradients (TP4 CP16 EP64 PP4 VPP8, DP1) offloads its whole
    # optimizer state, 448 GB of host memory on its most loaded node
    request = TrainingRequest(model="dsv3", seq_length=131072, hardware="h100", num_gpus=256, memory_margin=0.25)
    usual = search(request).best.plan
    lay = usual.layout
    assert usual.optimizer_offload_fraction == 1.0 and (lay.tp, lay.cp, lay.ep, lay.pp, lay.dp) == (4, 16, 64, 4, 1)
    ram = 500 * 10**9  # planning limit 425 GB; with 400 GB no layout fits HBM and host both
    assert estimate_host_memory(usual).total > HOST_MARGIN * ram
    monkeypatch.setitem(hardware_catalog.HARDWARE, "h100", dataclasses.replace(
        hardware_catalog.get_hardware("h100"), host_memory_bytes=ram))
    assert host_findings(usual)
    small = search(request).best.plan
    # a layout whose nodes hold less (PP2 EP128 with the deepest selective recompute: 423 GB), not the usual one
    assert estimate_host_memory(small).total <= HOST_MARGIN * ram < estimate_host_memory(usual).total
    assert (small.layout.pp, small.layout.ep) == (2, 128) and "moe" in small.recompute_modules
    assert not host_findings(small)


def test_explain_shows_host_memory():
    plan = recipe_plan("dsv3_128k_h100")
    text = explain_text(plan)
    assert ("host memory per node, node 24 (8 ranks; GiB; RAM 1863, planning limit 85%, 112 CPU cores):\n"
            "  data_loader       1.4\n  optimizer       257.2\n  pinned           98.0\n  checkpoint       42.9\n"
            "  processes        16.0\n  total           415.4") in text
    data = json.loads(json.dumps(explain_json(plan)))
    assert (data["host_node"], data["host_ranks"], data["host_margin"]) == (24, 8, HOST_MARGIN)
    assert data["host_memory_gib"]["total"] == pytest.approx(415.4, abs=0.05)
    assert data["host_ram_gib"] == pytest.approx(2e12 / GIB)


@pytest.mark.slow
def test_mask_build_measured_against_megatron_core():
    """megatron-core 0.19.2 builds the mask as float32 ones -> float32 tril -> bool: 8 bytes per element at the peak
    (peak RSS growth, measured in a fresh interpreter), 1 byte per element kept."""
    measure = load_script("measure_host_memory")
    peak, held = measure.measure_mask(4096)
    assert peak == pytest.approx(MASK_BUILD_BYTES, abs=0.5)
    assert held == pytest.approx(MASK_BYTES, abs=0.5)


@pytest.mark.slow
def test_user_yaml_with_the_mask_refused(configs, tmp_path, capsys):
    import copy

    from lcmoe_recipes.cli.check import main
    from lcmoe_recipes.emit import apply_overrides, write_yaml

    plan, cfg = configs["dsv3_128k_h100"]
    assert cfg.dataset.create_attention_mask is False and cfg.dataset.num_workers == plan.num_workers
    bad = copy.deepcopy(cfg)
    apply_overrides(bad, ["dataset.create_attention_mask=true"])
    path = write_yaml(bad, tmp_path / "mask.yaml", {"recipe": "mask", "world_size": 256, "hardware": "h100"})
    assert main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "error   host-memory/exceeds-ram: predicted host memory 25246 GiB on node 24 (8 ranks)" in out
    assert "fix: set dataset.create_attention_mask=false" in out


def test_asynchronous_save_held_on_the_host():
    """Each rank holds its share of an asynchronous save (its optimizer shard and the same share of the weights) in
    host memory while it is written (megatron-core 0.19.2 filesystem_async.py preload_tensors)."""
    from lcmoe_recipes.cost.memory import rank_memory
    from lcmoe_recipes.cost.wallclock import checkpoint_bytes, rank_save_bytes

    plan = recipe_plan("qwen3_next_8k_gb200")  # no optimizer offload: fp32 master + two fp32 moments + bf16 weight
    shard = rank_memory(plan, 0).detail["optimizer_shard_params"]
    assert rank_save_bytes(plan, 0) == shard * (2 + 4 + 4 + 4)
    host = estimate_host_memory(plan)  # a GB200 tray: 4 ranks of one pipeline stage
    assert host.checkpoint == 4 * rank_save_bytes(plan, host.node * 4 * 2 // 32)
    total = sum(rank_save_bytes(plan, r * 2 // 32) for r in range(32))  # every rank's share: about one save
    assert 0.9 < total / checkpoint_bytes(plan) < 1.1
    dsv3 = recipe_plan("dsv3_128k_h100")  # offloaded optimizer state is on the host already: only the rest is copied
    assert rank_save_bytes(dsv3, 0) < rank_memory(dsv3, 0).detail["optimizer_shard_params"] * (2 + 4 + 2 + 2)
