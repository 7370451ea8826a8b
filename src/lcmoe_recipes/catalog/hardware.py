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
        source: datasheet(s) the numbers come from.
    """

    key: str
    display: str
    device_name: str
    compute_capability: tuple[int, int]
    hbm_bytes: int
    gpus_per_node: int
    nvlink_domain: int
    source: str
    aliases: tuple[str, ...] = field(default=())

    @property
    def hbm_gib(self) -> float:
        """HBM per GPU in GiB (2**30 bytes)."""
        return self.hbm_bytes / 2**30

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
        Hardware("h100", "H100 SXM5 80GB (HGX)", "NVIDIA H100 80GB HBM3", (9, 0), 80 * 10**9, 8, 8,
                 "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 80 GB HBM3, NVLink 900 GB/s)", ("h100_sxm", "h100-sxm")),
        Hardware("h200", "H200 SXM 141GB (HGX)", "NVIDIA H200", (9, 0), 141 * 10**9, 8, 8,
                 "NVIDIA H200 Tensor Core GPU datasheet (141 GB HBM3e, NVLink 900 GB/s)", ("h200_sxm",)),
        Hardware("b200", "B200 180GB (HGX/DGX B200)", "NVIDIA B200", (10, 0), 180 * 10**9, 8, 8,
                 "NVIDIA DGX B200 datasheet (8 GPUs, 1,440 GB HBM3e total; NVLink 5, 1.8 TB/s per GPU)"),
        Hardware("gb200", "GB200 NVL72", "NVIDIA GB200", (10, 0), 186 * 10**9, 4, 72,
                 "NVIDIA GB200 NVL72 datasheet (72 Blackwell GPUs, 13.4 TB HBM3e = 186 GB each; 4 GPUs per "
                 "compute tray)", ("gb200_nvl72", "gb200-nvl72")),
        Hardware("gb300", "GB300 NVL72", "NVIDIA GB300", (10, 3), 288 * 10**9, 4, 72,
                 "NVIDIA GB300 NVL72 datasheet (72 Blackwell Ultra GPUs, up to 288 GB HBM3e each; 4 GPUs per "
                 "compute tray)", ("gb300_nvl72", "gb300-nvl72")),
    )
}

_ALIASES = {alias: h.key for h in HARDWARE.values() for alias in (h.key, *h.aliases)}


def get_hardware(name: str) -> Hardware:
    """The catalogue entry for ``name`` (case-insensitive).

    Raises:
        UnknownName: naming the valid hardware.
    """
    return lookup(name, HARDWARE, _ALIASES, "hardware")
