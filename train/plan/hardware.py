"""A small table of common accelerators and interconnects, for planning only.

Peak FLOP/s are dense bf16 tensor-core figures from the vendors' data sheets; link speeds are
per device, in GB/s, one direction, as the collectives see them: NVLink 4 (H100/H200, 900 GB/s
bidirectional) 450; NVLink 3 (A100) 300; PCIe 4 x16 ~25 usable; InfiniBand NDR 400 Gb/s per
GPU 50, HDR 200 Gb/s 25; 100 GbE 12.5. Give ``--memory-gib``, ``--peak-tflops`` or the link
speeds to plan for something else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from train.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    memory_gib: float
    peak_flops: float  # dense bf16
    intra_gbps: float  # device <-> device inside a node (GB/s)
    inter_gbps: float  # per device across nodes (GB/s)
    per_node: int = 8


DEVICES: dict[str, Device] = {
    "h200": Device("H200 SXM", 141, 989e12, 450, 50),
    "h100": Device("H100 SXM", 80, 989e12, 450, 50),
    "h100-pcie": Device("H100 PCIe", 80, 756e12, 25, 25),
    "a100": Device("A100 80GB SXM", 80, 312e12, 300, 25),
    "a100-40g": Device("A100 40GB SXM", 40, 312e12, 300, 25),
    "l40s": Device("L40S", 48, 362e12, 25, 12.5),
    "l4": Device("L4", 24, 121e12, 25, 12.5),
    "a10g": Device("A10G", 24, 70e12, 25, 12.5, per_node=4),
    "rtx4090": Device("RTX 4090", 24, 165e12, 25, 3, per_node=4),
    "mi300x": Device("MI300X", 192, 1307e12, 448, 50),
    "v100": Device("V100 32GB SXM", 32, 125e12, 150, 12.5),
}
LINKS_GBPS = {"nvlink4": 450, "nvlink3": 300, "pcie4": 25, "pcie5": 50, "ib-ndr": 50, "ib-hdr": 25, "eth-100g": 12.5}


def device(name: str, *, memory_gib: float | None = None, peak_tflops: float | None = None,
           intra: str | float | None = None, inter: str | float | None = None, per_node: int | None = None) -> Device:
    """A table entry with any figure overridden; link overrides are names from ``LINKS_GBPS`` or GB/s."""
    key = name.lower()
    if key not in DEVICES:
        raise ConfigError(f"--gpu {name!r} is not in the table; known: {', '.join(DEVICES)} "
                          "(or pick the closest and override --memory-gib / --peak-tflops / --intra / --inter)")
    dev = DEVICES[key]
    changes: dict = {}
    if memory_gib is not None:
        changes["memory_gib"] = memory_gib
    if peak_tflops is not None:
        changes["peak_flops"] = peak_tflops * 1e12
    for field_name, value in (("intra_gbps", intra), ("inter_gbps", inter)):
        if value is not None:
            changes[field_name] = _link(value)
    if per_node is not None:
        changes["per_node"] = per_node
    return replace(dev, **changes)


def _link(value: str | float) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    if value.lower() in LINKS_GBPS:
        return float(LINKS_GBPS[value.lower()])
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"link {value!r}: give GB/s or one of {', '.join(LINKS_GBPS)}") from None
