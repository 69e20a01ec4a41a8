"""A small table of common accelerators and interconnects, for planning only.

Peak FLOP/s are dense bf16 tensor-core figures from the vendors' data sheets; link speeds are
per device, in GB/s, one direction, as the collectives see them: NVLink 4 (H100/H200, 900 GB/s
bidirectional) 450; NVLink 3 (A100) 300; PCIe 4 x16 ~25 usable; InfiniBand NDR 400 Gb/s per
GPU 50, HDR 200 Gb/s 25; 100 GbE 12.5. Give ``--memory-gib``, ``--peak-tflops`` or the link
speeds to plan for something else.

On a machine with an accelerator, ``resolve`` plans for it by default: its memory is the driver's
total (``torch.cuda.mem_get_info``), its peak and links those of the table entry its name matches.
``resolve`` says which figure it used.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from winnow.train.errors import ConfigError


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


@dataclass(frozen=True, slots=True)
class LocalDevice:
    """This machine's first accelerator as torch sees it."""

    name: str
    total_gib: float  # the driver's total: what one training process can have at most
    free_gib: float  # free when asked (other processes' allocations excluded)


def local_device() -> LocalDevice | None:
    """The first CUDA (or ROCm) device of this machine, or None when there is none (or no torch)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(0)
    return LocalDevice(torch.cuda.get_device_name(0), total / 2**30, free / 2**30)


# fragments of the names torch reports, most specific first ("L40S" before "L4", "H100 PCIe" before "H100")
_NAME_KEYS = (
    ("H200", "h200"),
    ("H100 PCIe", "h100-pcie"),
    ("H100", "h100"),
    ("A100", "a100"),
    ("L40S", "l40s"),
    ("L4", "l4"),
    ("A10G", "a10g"),
    ("4090", "rtx4090"),
    ("MI300X", "mi300x"),
    ("V100", "v100"),
)


def table_key(device_name: str) -> str | None:
    """The table entry a reported device name is (``"NVIDIA H200"`` -> ``"h200"``), or None."""
    for fragment, key in _NAME_KEYS:
        if fragment.lower() in device_name.lower():
            return key
    return None


def resolve(
    gpu: str | None,
    *,
    memory_gib: float | None = None,
    peak_tflops: float | None = None,
    intra: str | float | None = None,
    inter: str | float | None = None,
    per_node: int | None = None,
    local: LocalDevice | None = None,
) -> tuple[Device, str]:
    """The device to plan for and where its memory figure comes from (printed by ``winnow plan``).

    ``gpu`` None means this machine's accelerator (``local``) when there is one, else the H100 entry.
    Its memory is, in order: ``memory_gib`` if given; this machine's total when it is the planned
    device type (or none was named); the table's figure otherwise.
    """
    key = gpu if gpu is not None else (table_key(local.name) or "h100") if local is not None else "h100"
    dev = device(key, memory_gib=memory_gib, peak_tflops=peak_tflops, intra=intra, inter=inter, per_node=per_node)
    here = local is not None and (gpu is None or table_key(local.name) == key.lower())
    if memory_gib is not None:
        return dev, "given (--memory-gib)"
    if here:
        dev = replace(dev, name=local.name, memory_gib=round(local.total_gib, 1))
        basis = (
            f"this machine's {local.name}: {local.total_gib:.1f} GiB total, {local.free_gib:.1f} GiB free now "
            "(torch.cuda.mem_get_info)"
        )
        if table_key(local.name) is None:
            basis += (
                f"; not in the table, so peak and links are the {key} entry's (set --peak-tflops, --intra, --inter)"
            )
        return dev, basis
    if local is not None:
        return dev, (
            f"the table's figure for {dev.name}; this machine's {local.name} has {local.total_gib:.1f} GiB "
            "(leave out --gpu to plan for it)"
        )
    return dev, f"the table's figure for {dev.name} (no accelerator on this machine; --memory-gib overrides)"


def device(
    name: str,
    *,
    memory_gib: float | None = None,
    peak_tflops: float | None = None,
    intra: str | float | None = None,
    inter: str | float | None = None,
    per_node: int | None = None,
) -> Device:
    """A table entry with any figure overridden; link overrides are names from ``LINKS_GBPS`` or GB/s."""
    key = name.lower()
    if key not in DEVICES:
        raise ConfigError(
            f"--gpu {name!r} is not in the table; known: {', '.join(DEVICES)} "
            "(or pick the closest and override --memory-gib / --peak-tflops / --intra / --inter)"
        )
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
