"""How much memory a device has free, and a one-line refusal of work that cannot fit (docs/design.md §6.2).

The estimates themselves (what a training step or a forward pass of a GPT needs) are in
:mod:`attnid.model.footprint`; this module only knows where memory comes from:

- the host: ``MemAvailable`` of ``/proc/meminfo`` (free memory plus what the kernel can
  reclaim), lowered to the cgroup's ``memory.max - memory.current`` in a container or a
  SLURM job that sets one; elsewhere ``sysconf``'s available pages; unknown (no check)
  when neither exists;
- a CUDA device: ``torch.cuda.mem_get_info``'s free bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from attnid.common.errors import UserError

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host_available_bytes() -> int | None:
    """Bytes the host can give this process now; None when the platform does not say."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        available = None
    if available is None and hasattr(os, "sysconf"):
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            available = None
    limit, used = _read_int(CGROUP_ROOT / "memory.max"), _read_int(CGROUP_ROOT / "memory.current")
    if limit is not None and used is not None:
        available = limit - used if available is None else min(available, limit - used)
    return available


def available_bytes(device: torch.device | str) -> tuple[int | None, str]:
    """``(free bytes or None, what they are)`` on ``device`` (a torch.device or its type)."""
    device_type = getattr(device, "type", str(device))
    if device_type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"the CUDA device {torch.cuda.get_device_name(device)} has"
    return host_available_bytes(), "the host has"


def format_size(count: float, unit: str = "B") -> str:
    """``count`` with a decimal prefix: 2.4 GB, 124.4 M parameters."""
    for prefix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {prefix}{unit}"
    return f"{int(count)} {unit}"


def require_memory(parts: dict[str, int], device: torch.device | str, what: str, advice: str) -> None:
    """Refuse (one UserError line) when the estimated ``parts`` ({name: bytes}) exceed what ``device``
    has free."""
    needed = sum(parts.values())
    free, where = available_bytes(device)
    if free is None or needed <= free:
        return
    shown = ", ".join(f"{name} {format_size(size)}" for name, size in parts.items() if size)
    raise UserError(
        f"{what} needs about {format_size(needed)} ({shown}) but {where} {format_size(free)} "
        f"available: {advice} (estimate: docs/design.md §6.2)"
    )
