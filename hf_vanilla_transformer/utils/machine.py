"""The machine a run or a benchmark ran on, in one place: the CPU's name and matrix units, the accelerator, the peak
memory of this process. Every figure this package writes names its machine through `describe_machine()`."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import resource
from pathlib import Path

import torch


# The CPU extensions that decide what runs fast: AVX2 / AVX-512 for fp32, AVX512-BF16 and AMX for bf16 autocast.
EXTENSIONS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def cpu_name() -> str:
    """The CPU's `model name` (Linux), else what `platform` says."""
    lines = _cpuinfo()
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    return name or platform.processor() or platform.machine()


def hardware_extensions() -> list[str]:
    """Which of `EXTENSIONS` the CPU has (empty where /proc/cpuinfo cannot be read), whatever the kernels may use."""
    flags = next((line.split(":", 1)[1].split() for line in _cpuinfo() if line.startswith("flags")), [])
    return [flag for flag in EXTENSIONS if flag in flags]


# The kernels' instruction sets capped by the environment, as a laptop without AVX-512 or AMX is emulated on a CPU
# that has them (docs/budget_curve.md): PyTorch's own kernels (ATEN_CPU_CAPABILITY), oneDNN's (ONEDNN_MAX_CPU_ISA,
# which the bf16 matrix products use) and MKL's (MKL_ENABLE_INSTRUCTIONS, the fp32 ones). Each cap -> the extensions
# the capped library may still use; a value not listed caps nothing this package knows of.
KERNEL_CAPS = {
    "ATEN_CPU_CAPABILITY": {"default": (), "avx2": ("avx2",)},
    "ONEDNN_MAX_CPU_ISA": {
        "SSE41": (),
        "AVX": (),
        "AVX2": ("avx2",),
        "AVX2_VNNI": ("avx2",),
        "AVX2_VNNI_2": ("avx2",),
        "AVX512_CORE": ("avx2", "avx512f"),
        "AVX512_CORE_VNNI": ("avx2", "avx512f", "avx512_vnni"),
        "AVX512_CORE_BF16": ("avx2", "avx512f", "avx512_vnni", "avx512_bf16"),
    },
    "MKL_ENABLE_INSTRUCTIONS": {"SSE4_2": (), "AVX": (), "AVX2": ("avx2",), "AVX512": ("avx2", "avx512f")},
}
# What each library's cap governs: ATen's vector kernels (AVX-512 ones), MKL's fp32 products, oneDNN's bf16 units.
CAPPED_BY = {
    "ATEN_CPU_CAPABILITY": ("avx512f", "avx512_vnni"),
    "ONEDNN_MAX_CPU_ISA": ("avx512_vnni", "avx512_bf16", "amx_bf16"),
    "MKL_ENABLE_INSTRUCTIONS": ("avx512f",),
}


def kernel_caps() -> dict[str, str]:
    """The caps of `KERNEL_CAPS` set in this process's environment that cap something (variable -> value)."""
    found = {}
    for variable, caps in KERNEL_CAPS.items():
        value = os.environ.get(variable, "").strip()
        if value.upper() in {key.upper() for key in caps}:
            found[variable] = value
    return found


def cpu_extensions() -> list[str]:
    """Which of `EXTENSIONS` the kernels may use: the CPU's (`hardware_extensions`), less those a cap of the
    environment withholds from the library that uses them (`kernel_caps`): under `ONEDNN_MAX_CPU_ISA=AVX2` a CPU with
    AMX has no bf16 units for this package, as a laptop without them."""
    extensions = hardware_extensions()
    for variable, value in kernel_caps().items():
        allowed = next(kept for key, kept in KERNEL_CAPS[variable].items() if key.upper() == value.upper())
        extensions = [flag for flag in extensions if flag in allowed or flag not in CAPPED_BY[variable]]
    return extensions


def cpu_has_fast_bf16() -> bool:
    """True on CPUs with native bf16 matrix units (AMX or AVX512-BF16) that the kernels may use, where bf16 autocast
    may speed training up."""
    extensions = cpu_extensions()
    return "amx_bf16" in extensions or "avx512_bf16" in extensions


def describe_cpu() -> str:
    """The CPU's name and the matrix extensions that decide what runs fast on it; where the environment caps the
    kernels, what it caps and the extensions the CPU has."""
    said = f"{cpu_name()} ({', '.join(cpu_extensions()) or 'no AVX2'}"
    caps = kernel_caps()
    if caps and cpu_extensions() != hardware_extensions():
        capped = ", ".join(f"{variable}={value}" for variable, value in caps.items())
        said += f"; kernels capped by {capped}, the CPU has {', '.join(hardware_extensions())}"
    return said + ")"


def describe_machine(device: str | torch.device | None = None) -> str:
    """One line naming where this runs: the GPUs (count and name) when `device` is CUDA (None: where CUDA is
    available), else the CPU, its extensions, its cores and the threads PyTorch uses."""
    kind = torch.device(device).type if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda":
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"{describe_cpu()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"


def describe_device(device: str | torch.device) -> str:
    """The device a run trains on, in a few words: its GPU's name (CUDA), else the CPU's name and cores."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()}, {os.cpu_count()} cores"


def children_peak_rss_bytes() -> int:
    """The largest peak resident memory of this process's children that have ended (worker processes)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def _proc_bytes(paths: tuple[str, ...], fields: dict[str, str]) -> dict[str, int]:
    """The "Name: N kB" lines `fields` names (line name -> key) in the /proc files `paths`, in bytes; the first of
    each wins; none where the files cannot be read (not Linux)."""
    found = {}
    for path in paths:
        try:
            with open(path) as lines:
                for line in lines:
                    words = line.split()
                    if words and words[0] in fields and fields[words[0]] not in found:
                        found[fields[words[0]]] = int(words[1]) * 1024
        except OSError:
            pass
    return found


def memory_now() -> dict[str, int]:
    """This process's resident memory now, split (Linux; empty elsewhere): `anon_rss_bytes` its own memory,
    `file_rss_bytes` pages of mapped files (memory-mapped Arrow among them: page cache that every process mapping
    the file shares and the system can take back), `pss_bytes` its proportional share (shared pages divided among
    the processes that map them: the sum over the processes of a launch is what they hold together)."""
    fields = {"RssAnon:": "anon_rss_bytes", "RssFile:": "file_rss_bytes", "Pss:": "pss_bytes"}
    return _proc_bytes(("/proc/self/status", "/proc/self/smaps_rollup"), fields)


def mapped_bytes(suffix: str = ".arrow") -> dict[str, int]:
    """The resident pages of this process's mappings of files named `*suffix` (the memory-mapped Arrow files of the
    corpus and its tokenization), Linux only: `arrow_rss_bytes` all of them, `arrow_pss_bytes` this process's share
    (summed over the processes of a launch: the data's pages counted once)."""
    found, counted = {"arrow_rss_bytes": 0, "arrow_pss_bytes": 0}, False
    fields = {"Rss:": "arrow_rss_bytes", "Pss:": "arrow_pss_bytes"}
    try:
        with open("/proc/self/smaps") as lines:
            for line in lines:
                words = line.split()
                if not words or words[0].endswith(":"):  # a field of the mapping above
                    if counted and words and words[0] in fields:
                        found[fields[words[0]]] += int(words[1]) * 1024
                else:  # a mapping: "start-end perms offset device inode [path]"
                    counted = len(words) >= 6 and words[-1].endswith(suffix)
    except OSError:
        return {}
    return found


def reset_peak_rss() -> None:
    """Start `peak_rss_bytes` again from the memory the process holds now (Linux; elsewhere nothing happens)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far: on Linux the high-water mark of its own memory (VmHWM; ru_maxrss
    survives exec, so a spawned child would report its parent's peak when that was higher), else ru_maxrss."""
    peak = _proc_bytes(("/proc/self/status",), {"VmHWM:": "peak"}).get("peak")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


MADV_DONTNEED = 4  # Linux's madvise advice: drop the mapping's pages from this process (a file's stay page cache)


def release_mapped_pages(suffix: str = ".arrow") -> int:
    """Unmap from this process the resident pages of its read-only mappings of files named `*suffix` (the memory-
    mapped Arrow files), Linux only; returns the bytes of the mappings advised. The pages stay in the page cache and
    come back at the next read of them, so the data reads the same; what goes is their count in this process's
    resident memory: a pass over a corpus of several GB (the BPE's sample, a tokenizing worker) keeps mapped only
    the pages it read since the last call, not every page it ever read. Writable mappings are left alone (dropping
    their pages could lose data)."""
    try:
        with open("/proc/self/maps") as lines:  # (called for every training batch: only the files' lines are split)
            ranges = [_read_only_file_range(line.split(), suffix) for line in lines if line.rstrip().endswith(suffix)]
        madvise = _madvise()
    except OSError:
        return 0
    released = 0
    for start, end in filter(None, ranges):
        if madvise(start, end - start, MADV_DONTNEED) == 0:
            released += end - start
    return released


@functools.cache
def _madvise():
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise


def _read_only_file_range(words: list[str], suffix: str) -> tuple[int, int] | None:
    """(start, end) of a /proc/self/maps line's mapping if it maps a file named `*suffix` without write access."""
    if len(words) < 6 or not words[-1].endswith(suffix) or "w" in words[1]:
        return None
    start, end = (int(value, 16) for value in words[0].split("-"))
    return start, end
