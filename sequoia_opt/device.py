"""What a measurement ran on: device name, software versions, threads. Recorded in every profile."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

import torch

from .omp import run_policy


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The CPU's instruction-set flags: the words of the first ``flags`` (x86) or ``Features`` (Arm) line of
    ``cpuinfo`` (Linux's /proc/cpuinfo); empty when it has no such line, None where it cannot be read (another
    OS). What llama.cpp's AMX check, the tuned kernels' cache key and the bfloat16 warning of the head's
    distillation read."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    return frozenset(line.split(":", 1)[-1].split())


def cpu_name() -> str:
    """The CPU model name from /proc/cpuinfo (Linux), else ``platform.processor()``, else ``"cpu"``."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
        if m:
            return m.group(1).strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def device_name(device: torch.device | str) -> str:
    """Human-readable device name: the GPU's name for CUDA, the CPU model otherwise."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def free_memory_bytes(device: torch.device | str) -> int:
    """Memory free for new allocations on ``device`` (bytes): the GPU's free memory for CUDA
    (``torch.cuda.mem_get_info``), else the host's available memory (``MemAvailable`` in /proc/meminfo on
    Linux, else free physical pages)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        m = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
        if m:
            return int(m.group(1)) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 2**62  # unknown: refuse nothing


def device_slug(device: torch.device | str) -> str:
    """A folder-safe slug for ``profiles/<device-slug>/``: ``cpu-<model>`` or ``cuda-<gpu name>``."""
    device = torch.device(device)
    name = device_name(device).lower()
    name = re.sub(r"\(r\)|\(tm\)|cpu @.*|processor", "", name)
    slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-")[:40].strip("-")
    return f"{device.type}-{slug}" if slug else device.type


def device_info(device: torch.device | str, dtype: torch.dtype) -> dict[str, object]:
    """Mapping stored under ``device:`` in a latency profile (name, versions, dtype, threads; on a CPU the
    OpenMP wait policy the threads ran under, ``OMP_WAIT_POLICY`` or None for the runtime's default: the
    ``treeopt`` command sets PASSIVE, which changes T(n), see ``benchmarks/omp_wait.py``)."""
    device = torch.device(device)
    info: dict[str, object] = {
        "name": device_name(device),
        "type": device.type,
        "torch_version": str(torch.__version__),
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cpu":
        info["omp_wait_policy"] = run_policy(device.type)
    if device.type == "cuda":
        info["cuda_version"] = str(torch.version.cuda)
        try:
            import subprocess

            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            info["driver_version"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
        except (OSError, IndexError, subprocess.SubprocessError):
            info["driver_version"] = None
    return info
