"""The :class:`~flexinfer_actuator.ports.GpuMemory` adapters: NVML (``nvidia-ml-py``, ctypes over
``libnvidia-ml.so``), amdsmi (ctypes over ``libamd_smi.so``, shipped with ROCm: used when importable) and the null
one. :func:`open_gpu_memory` takes the first whose library initialises; on a machine without a GPU driver every
init fails, which means "no GPU here": said once at info, and nothing is measured.

The process ids the drivers report are the host's: an actuator in a container without the host's PID namespace
sees none of its model processes among them, and so measures nothing.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from flexinfer_actuator.domain.gpu_memory import GpuDevice, ProcessMemory
from flexinfer_actuator.ports import GpuMemory
from flexinfer_common.logs import get_logger

log = get_logger("flexinfer.actuator.gpu")


class NullGpuMemory:
    """No GPU (or no driver): no device, no process."""

    name = "none"

    def devices(self) -> list[GpuDevice]:
        return []

    def processes(self) -> list[ProcessMemory]:
        return []

    def close(self) -> None:
        return None


class NvmlGpuMemory:
    """NVIDIA's NVML through ``pynvml`` (a module given, so a test can hand in a fake one)."""

    name = "nvml"

    def __init__(self, nvml: Any) -> None:
        """``nvml``: the ``pynvml`` module, already initialised (``nvmlInit``)."""
        self._nvml = nvml

    def _handles(self) -> list[Any]:
        return [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(self._nvml.nvmlDeviceGetCount()))]

    def devices(self) -> list[GpuDevice]:
        return [
            GpuDevice(index=i, total_bytes=int(self._nvml.nvmlDeviceGetMemoryInfo(handle).total))
            for i, handle in enumerate(self._handles())
        ]

    def processes(self) -> list[ProcessMemory]:
        out: list[ProcessMemory] = []
        for index, handle in enumerate(self._handles()):
            for process in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = getattr(process, "usedGpuMemory", None)
                if used is not None:  # None: the driver cannot say (some virtualised setups)
                    out.append(ProcessMemory(pid=int(process.pid), device=index, bytes=int(used)))
        return out

    def close(self) -> None:
        self._nvml.nvmlShutdown()


class AmdSmiGpuMemory:
    """AMD's amdsmi (ROCm): devices' VRAM and each process's VRAM use."""

    name = "amdsmi"

    def __init__(self, amdsmi: Any) -> None:
        """``amdsmi``: the module, already initialised (``amdsmi_init``)."""
        self._smi = amdsmi

    def devices(self) -> list[GpuDevice]:
        vram = self._smi.AmdSmiMemoryType.VRAM
        return [
            GpuDevice(index=i, total_bytes=int(self._smi.amdsmi_get_gpu_memory_total(handle, vram)))
            for i, handle in enumerate(self._smi.amdsmi_get_processor_handles())
        ]

    def processes(self) -> list[ProcessMemory]:
        out: list[ProcessMemory] = []
        for index, handle in enumerate(self._smi.amdsmi_get_processor_handles()):
            for entry in self._smi.amdsmi_get_gpu_process_list(handle):
                info = entry if isinstance(entry, dict) else self._smi.amdsmi_get_gpu_process_info(handle, entry)
                usage = info.get("memory_usage") or {}
                used = usage.get("vram_mem", info.get("mem"))
                if isinstance(used, int) and "pid" in info:
                    out.append(ProcessMemory(pid=int(info["pid"]), device=index, bytes=used))
        return out

    def close(self) -> None:
        self._smi.amdsmi_shut_down()


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def open_gpu_memory(*, nvml: Any | None = None, amdsmi: Any | None = None) -> GpuMemory:
    """The adapter of the first GPU library that initialises here (NVML, then amdsmi), else the null one. The
    modules default to the installed ``pynvml`` and ``amdsmi`` (either may be absent)."""
    tried: list[str] = []
    nvml = nvml if nvml is not None else _import("pynvml")
    if nvml is not None:
        try:
            nvml.nvmlInit()
            monitor: GpuMemory = NvmlGpuMemory(nvml)
            log.info("GPU memory measured through NVML", extra={"devices": len(monitor.devices())})
            return monitor
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no NVIDIA GPU here
            tried.append(f"nvml: {exc}")
    amdsmi = amdsmi if amdsmi is not None else _import("amdsmi")
    if amdsmi is not None:
        try:
            amdsmi.amdsmi_init()
            monitor = AmdSmiGpuMemory(amdsmi)
            log.info("GPU memory measured through amdsmi", extra={"devices": len(monitor.devices())})
            return monitor
        except Exception as exc:  # AmdSmiLibraryException and the like: no AMD GPU here
            tried.append(f"amdsmi: {exc}")
    else:
        tried.append("amdsmi: not installed")
    log.info("no GPU here: GPU memory is not measured", extra={"tried": "; ".join(tried)})
    return NullGpuMemory()


def process_parents(proc: Path = Path("/proc")) -> dict[int, int]:
    """This machine's process table, pid -> parent pid (Linux ``/proc/<pid>/stat``; empty elsewhere)."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return parents
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = (proc / entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")"
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 2 and fields[1].isdigit():
            parents[int(entry)] = int(fields[1])
    return parents
