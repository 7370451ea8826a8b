"""Hardware catalogue: the target GPUs our recipes are planned for.

Numbers are vendor datasheet values (sources beside each entry). ``device_name`` and ``compute_capability`` are
what ``torch.cuda.get_device_properties`` reports on that GPU; megatron-bridge's dispatcher validation reads them,
and :mod:`lcmoe_recipes.emit.target` answers that probe for the *target* GPU, not the machine building the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .lookup import lookup


@dataclass(frozen=True)
class Hardware:
    """One GPU type as deployed in its usual system.

    Attributes:
        key: short name (``h100``, ``h200``, ``b200``, ``gb200``, ``gb300``).
        device_name: the name ``torch.cuda.get_device_properties(0).name`` reports.
        compute_capability: (major, minor).
        hbm_bytes: HBM per GPU, bytes (datasheet GB = 1e9 bytes).
        gpus_per_node: GPUs per Slurm node (8 on HGX/DGX; 4 per GB200/GB300 compute tray).
        nvlink_domain: GPUs joined by one NVLink/NVSwitch fabric (8 on HGX; 72 on NVL72 racks).
        job_block: GPUs a large job gets contiguously inside one NVLink domain. HGX: the node (8). NVL72: 64 --
            NVIDIA recommends Slurm ``--segment=16`` (16 trays x 4 GPUs) for jobs of 128+ GPUs such as MoE training
            (NVIDIA technical blog "Unlock exascale performance on GB200 NVL72 with Slurm topology-aware job
            scheduling", 2026). Rank r sits in block r // job_block (torchrun/Slurm fill nodes in rank order).
        peak_tflops: dense (no sparsity) tensor-core TFLOP/s per GPU by precision: "bf16", "fp8", and "fp4" where
            the GPU has it (MXFP8 runs at the FP8 rate).
        nvlink_gbps: NVLink bandwidth per GPU per direction, GB/s (half the datasheet's bidirectional figure).
        scaleout_gbps: scale-out (InfiniBand / Ethernet) bandwidth per GPU per direction, GB/s (one 400 Gb/s NIC
            per GPU = 50 GB/s; ConnectX-8 800 Gb/s = 100 GB/s).
        host_memory_bytes: CPU (host) memory per node -- per Slurm node as ``gpus_per_node`` counts it -- in bytes
            (datasheet TB = 1e12 bytes): the DGX system memory on HGX/DGX, the two Grace CPUs' LPDDR5X of one
            compute tray on NVL72. Priced by :mod:`lcmoe_recipes.cost.host`.
        cpu_cores: CPU cores per node (same node).
        source: datasheet(s) the numbers come from.
        cpu_arch: the node CPU's architecture as ``platform.machine()`` names it: ``x86_64`` (Intel Xeon on
            HGX/DGX) or ``aarch64`` (Grace, Arm Neoverse V2, on NVL72), as the sources say: the platform of the
            wheels an overlay for these nodes holds (:mod:`lcmoe_recipes.jobs.overlay`).
        host_memory_gbps: the node's host (CPU) memory bandwidth, GB/s, all sockets together: channels x transfer
            rate x 8 bytes for DDR5 Xeons (the vendor's maximum memory speed with one DIMM per channel), the
            datasheet figure per Grace CPU for LPDDR5X. A peak: what CPU Adam under optimizer offload streams
            through (:func:`lcmoe_recipes.cost.offload.offload_step_seconds`).
        host_link_gbps: host <-> GPU bandwidth per GPU per direction, GB/s: PCIe Gen5 x16 on HGX/DGX (64 GB/s),
            NVLink-C2C on Grace Blackwell (900 GB/s bidirectional per superchip, shared by its two GPUs: 225).
        host_source: the datasheets the two host figures come from.
        hbm_gbps: HBM bandwidth per GPU, GB/s (datasheet TB/s x 1000): H100 SXM 3,350; H200 4,800; B200 8,000 (DGX
            B200: 64 TB/s for 8 GPUs); GB200 and GB300 8,000 (GB200 / GB300 NVL72: 576 TB/s for 72 GPUs). What the
            memory-bound kernels stream through (the unfused attention path, :mod:`lcmoe_recipes.cost.attention`).
        sm_count: streaming multiprocessors per GPU: H100 SXM5 and H200 132 (NVIDIA H100 Tensor Core GPU
            Architecture whitepaper; H200 is the same GH100 configuration), B200 148 (Chips and Cheese, "Nvidia's
            B200: Keeping the CUDA Juggernaut Rolling", 2025: 74 of each die's 80 enabled), GB200 148 (the same
            Blackwell GPU), GB300 160 (NVIDIA technical blog "Inside NVIDIA Blackwell Ultra", 2025). What a
            communication kernel that holds some of them takes from the compute beside it
            (:func:`lcmoe_recipes.cost.overlap.contended`).
    """

    key: str
    display: str
    device_name: str
    compute_capability: tuple[int, int]
    hbm_bytes: int
    gpus_per_node: int
    nvlink_domain: int
    job_block: int
    peak_tflops: dict[str, float]
    nvlink_gbps: float
    scaleout_gbps: float
    host_memory_bytes: int
    cpu_cores: int
    source: str
    aliases: tuple[str, ...] = field(default=())
    cpu_arch: str = "x86_64"
    host_memory_gbps: float = 0.0
    host_link_gbps: float = 0.0
    host_source: str = ""
    hbm_gbps: float = 0.0
    sm_count: int = 0

    def peak(self, precision: str) -> float:
        """Dense peak TFLOP/s for one of our precision keys (bf16, fp8_blockwise, fp8_cs, mxfp8)."""
        return self.peak_tflops["bf16" if precision == "bf16" else "fp8"]

    def whole_node_counts(self, num_gpus: int) -> tuple[int, int] | None:
        """The GPU counts nearest below and above ``num_gpus`` that fill whole nodes of :attr:`gpus_per_node` or
        divide one, when ``num_gpus`` does neither; None when it does (a job places ranks node by node, and Slurm and
        torchrun give every node the same ``--ntasks-per-node`` / ``--nproc-per-node``)."""
        per, n = self.gpus_per_node, num_gpus
        if n < 1 or not (n % per and per % n):
            return None
        allowed = [d for d in range(1, per) if per % d == 0] + [per * k for k in range(1, n // per + 2)]
        return max(a for a in allowed if a < n), min(a for a in allowed if a > n)

    @property
    def hbm_gib(self) -> float:
        """HBM per GPU in GiB (2**30 bytes)."""
        return self.hbm_bytes / 2**30

    @property
    def host_memory_gib(self) -> float:
        """Host memory per node in GiB (2**30 bytes)."""
        return self.host_memory_bytes / 2**30

    @property
    def supports_deepep(self) -> bool:
        """DeepEP runs on Ampere/Hopper (SM 8.x/9.x) and on B200/B300, not on NVL72 GB200/GB300.

        Source: megatron-bridge 0.6.2 ``training/flex_dispatcher_backend.py`` (the same rule its validate() applies).
        """
        return self.compute_capability[0] in (8, 9) or self.device_name.startswith(("NVIDIA B200", "NVIDIA B300"))

    @property
    def supports_hybridep(self) -> bool:
        """HybridEP runs on SM 8.x/9.x/10.x (source: as :attr:`supports_deepep`)."""
        return self.compute_capability[0] in (8, 9, 10)


HARDWARE: dict[str, Hardware] = {
    h.key: h
    for h in (
        Hardware("h100", "H100 SXM5 80GB (HGX)", "NVIDIA H100 80GB HBM3", (9, 0), 80 * 10**9, 8, 8, 8,
                 {"bf16": 989.4, "fp8": 1978.9}, 450.0, 50.0, 2 * 10**12, 112,
                 "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 80 GB HBM3; BF16 1,979 / FP8 3,958 TFLOPS with "
                 "sparsity, half that dense; NVLink 900 GB/s); DGX H100: one ConnectX-7 400 Gb/s per GPU; host: "
                 "NVIDIA DGX BasePOD reference architecture, 'Core Components' (DGX H200 and H100: dual Intel Xeon "
                 "Platinum 8480C, 112 cores total; 2 TB of DDR5 system memory)",
                 ("h100_sxm", "h100-sxm"), host_memory_gbps=614.4, hbm_gbps=3350.0, sm_count=132, host_link_gbps=64.0,
                 host_source="Intel ARK, Xeon Platinum 8480+ (DGX's 8480C is its custom variant): 8 DDR5 "
                             "channels, max memory speed 4800 MT/s -> 8 x 4.8 GT/s x 8 B = 307.2 GB/s per socket, "
                             "614.4 GB/s for two; NVIDIA H100 Tensor Core GPU datasheet (SXM: PCIe Gen5 128 GB/s, "
                             "64 GB/s per direction)"),
        Hardware("h200", "H200 SXM 141GB (HGX)", "NVIDIA H200", (9, 0), 141 * 10**9, 8, 8, 8,
                 {"bf16": 989.4, "fp8": 1978.9}, 450.0, 50.0, 2 * 10**12, 112,
                 "NVIDIA H200 Tensor Core GPU datasheet (141 GB HBM3e; same tensor cores as H100 SXM; NVLink "
                 "900 GB/s); HGX H200: one 400 Gb/s NIC per GPU; host: NVIDIA DGX BasePOD reference architecture, "
                 "'Core Components' (DGX H200: dual Xeon Platinum 8480C, 112 cores; 2 TB of DDR5 system memory)",
                 ("h200_sxm",), host_memory_gbps=614.4, hbm_gbps=4800.0, sm_count=132, host_link_gbps=64.0,
                 host_source="Intel ARK, Xeon Platinum 8480+ (DGX's 8480C is its custom variant): 8 DDR5 "
                             "channels, max memory speed 4800 MT/s -> 8 x 4.8 GT/s x 8 B = 307.2 GB/s per socket, "
                             "614.4 GB/s for two; NVIDIA H200 Tensor Core GPU datasheet (SXM: PCIe Gen5 128 GB/s, "
                             "64 GB/s per direction)"),
        Hardware("b200", "B200 180GB (HGX/DGX B200)", "NVIDIA B200", (10, 0), 180 * 10**9, 8, 8, 8,
                 {"bf16": 2250.0, "fp8": 4500.0, "fp4": 9000.0}, 900.0, 50.0, 2 * 10**12, 112,
                 "NVIDIA DGX B200 datasheet (8 GPUs, 1,440 GB HBM3e; 72 PFLOPS FP8 training and 144 PFLOPS FP4 "
                 "inference with sparsity for 8 GPUs; NVLink 5 1.8 TB/s per GPU; 8 x ConnectX-7 400 Gb/s); host: "
                 "NVIDIA DGX B200 User Guide, 'Introduction to NVIDIA DGX B200 Systems' (2 x Intel Xeon 8570, 56 "
                 "cores each; system memory 2 TB using 32 DIMMs, upgradable to 4 TB -- the shipped 2 TB is used)",
                 host_memory_gbps=716.8, hbm_gbps=8000.0, sm_count=148, host_link_gbps=64.0,
                 host_source="Intel ARK, Xeon Platinum 8570: 8 DDR5 channels, max memory speed 5600 MT/s -> 358.4 "
                             "GB/s per socket, 716.8 GB/s for two (32 DIMMs on 16 channels is two per channel, which "
                             "Intel rates lower: an upper bound); HGX B200: each GPU on PCIe Gen5 x16 to the host "
                             "(64 GB/s per direction)"),
        Hardware("gb200", "GB200 NVL72", "NVIDIA GB200", (10, 0), 186 * 10**9, 4, 72, 64,
                 {"bf16": 2500.0, "fp8": 5000.0, "fp4": 10000.0}, 900.0, 50.0, 960 * 10**9, 144,
                 "NVIDIA GB200 NVL72 datasheet (72 GPUs: 13.4 TB HBM3e = 186 GB each; FP8 720 / BF16 360 / FP4 1,440 "
                 "PFLOPS with sparsity per rack; NVLink 5 1.8 TB/s per GPU); 400 Gb/s scale-out per GPU; host: the "
                 "same datasheet (GB200 Grace Blackwell Superchip: 72 Arm Neoverse V2 cores, up to 480 GB LPDDR5X; "
                 "rack: 36 Grace CPUs, 2,592 cores, up to 17 TB LPDDR5X) -- a compute tray (a Slurm node) holds two "
                 "superchips: 144 cores and up to 960 GB",
                 ("gb200_nvl72", "gb200-nvl72"), "aarch64", host_memory_gbps=1000.0, hbm_gbps=8000.0, sm_count=148,
                 host_link_gbps=225.0,
                 host_source="NVIDIA Grace CPU Superchip datasheet (LPDDR5X, up to 1 TB/s for its two Grace "
                             "CPUs: 500 GB/s per Grace); a compute tray holds two Grace CPUs: 1,000 GB/s per node; "
                             "GB200 NVL72 datasheet "
                             "(NVLink-C2C 900 GB/s bidirectional between a Grace and its two GPUs: 450 GB/s per "
                             "direction, 225 per GPU)"),
        Hardware("gb300", "GB300 NVL72", "NVIDIA GB300", (10, 3), 288 * 10**9, 4, 72, 64,
                 {"bf16": 2500.0, "fp8": 5000.0, "fp4": 15000.0}, 900.0, 100.0, 960 * 10**9, 144,
                 "NVIDIA GB300 NVL72 datasheet (72 Blackwell Ultra GPUs, up to 288 GB HBM3e each; FP8 720 PFLOPS "
                 "sparse and FP4 1,080 PFLOPS dense per rack; NVLink 5 1.8 TB/s per GPU; ConnectX-8 800 Gb/s); host: "
                 "the same datasheet (36 Grace CPUs, 2,592 Arm Neoverse V2 cores, up to 17 TB LPDDR5X per rack) and "
                 "NVIDIA Enterprise Reference Architecture 'NVL72 AI factory', System Hardware & Components (a compute "
                 "tray holds 4 GPUs and 2 Grace CPUs): 144 cores and up to 2 x 480 GB per tray",
                 ("gb300_nvl72", "gb300-nvl72"), "aarch64", host_memory_gbps=1000.0, hbm_gbps=8000.0, sm_count=160,
                 host_link_gbps=225.0,
                 host_source="NVIDIA Grace CPU Superchip datasheet (LPDDR5X, up to 1 TB/s for its two Grace "
                             "CPUs: 500 GB/s per Grace); a compute tray holds two Grace CPUs: 1,000 GB/s per node; "
                             "GB300 NVL72 datasheet "
                             "(NVLink-C2C 900 GB/s bidirectional between a Grace and its two GPUs: 450 GB/s per "
                             "direction, 225 per GPU)"),
    )
}

_ALIASES = {alias: h.key for h in HARDWARE.values() for alias in (h.key, *h.aliases)}


def get_hardware(name: str) -> Hardware:
    """The catalogue entry for ``name`` (case-insensitive).

    Raises:
        UnknownName: naming the valid hardware.
    """
    return HARDWARE.get(name) or lookup(name, HARDWARE, _ALIASES, "hardware")  # a key: the common case
