"""What a model process holds on the GPU, from what the driver reports per process (pure: no I/O).

The driver (NVML, amdsmi) lists the processes using each device and the memory each holds; a model's server is a
process tree (vLLM starts worker processes, a shell its children), so the model holds what every process of that
tree holds. ``status.memory`` is what a model holds on each of its devices: the largest per-device sum.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessMemory:
    """One process's use of one device, as the driver reports it."""

    pid: int
    device: int
    bytes: int


@dataclass(frozen=True)
class GpuDevice:
    """One device of this machine and its total memory."""

    index: int
    total_bytes: int


def process_tree(root: int, parents: Mapping[int, int]) -> frozenset[int]:
    """``root`` and every process descended from it, from a map of pid -> parent pid (the process table)."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    tree = {root}
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), ()):
            if child not in tree:
                tree.add(child)
                pending.append(child)
    return frozenset(tree)


def memory_per_device(usage: Iterable[ProcessMemory], pids: frozenset[int]) -> dict[int, int]:
    """What the processes ``pids`` hold on each device they use (device index -> bytes)."""
    out: dict[int, int] = {}
    for entry in usage:
        if entry.pid in pids:
            out[entry.device] = out.get(entry.device, 0) + entry.bytes
    return out


def model_memory(per_device: Mapping[int, int]) -> int | None:
    """A model's ``status.memory`` figure: the most it holds on any one device (None: it holds none, or the driver
    lists none of its processes)."""
    figures = [b for b in per_device.values() if b > 0]
    return max(figures) if figures else None
