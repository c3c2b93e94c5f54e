"""Process-level settings: a caching memory allocator for CPU training.

A training step frees and re-allocates the same large buffers (activations, logits, attention scores) of
ever-changing sizes. glibc's allocator returns them to the kernel and fragments its heap: on the 2-core machine
this package is developed on, a `small` model step took 0.55 s rising to 0.62 s over 240 steps with the process
growing from 3.3 to 5.1 GB, against a steady 0.37 s and 2.4 GB with mimalloc (`MIMALLOC_PURGE_DELAY=-1`, the
same with tcmalloc). The allocator changes no number the model computes.

`use_fast_allocator()` re-executes the current command with mimalloc preloaded, once, at the start of a script.
It does nothing where mimalloc is not installed (the `cmeel-mimalloc` wheel, a Linux dependency of this
package), where another allocator is already preloaded, or when `HF_VANILLA_TRANSFORMER_ALLOCATOR=system`.

It also lets oneDNN keep more of its primitives (`primitive_cache_capacity`). Every distinct shape of a matrix
product (forward, and both products of its backward) is a oneDNN primitive, created the first time it is met; the
cache keeps 1,024 of them by default. The help corpus's batches come in 664 distinct shapes at 1,024 tokens, several
primitives each, so with the default every epoch creates them again. With 16,384 an update of the main job
(`small`, bf16, eager) took 0.194 s in its second epoch against 0.230 s (-15%, +18% updates in a budget), the
process peaking at 5.2 GB against 1.6 GB (AMD EPYC Zen 4, 2 cores; docs/cpu_recipe.md). The larger cache is set
only where the machine has `CACHE_MEMORY_BYTES` of memory per training process, and never over a value the user
set (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`). It changes no number the model computes.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path


def mimalloc_library() -> Path | None:
    """The shared library of the installed `cmeel-mimalloc` distribution, if any."""
    try:
        files = metadata.distribution("cmeel-mimalloc").files or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name.startswith("libmimalloc.so"):
            path = Path(file.locate()).resolve()
            if path.exists():
                return path
    return None


PRIMITIVE_CACHE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
LARGE_PRIMITIVE_CACHE = 16384  # primitives; oneDNN's default is 1,024
CACHE_MEMORY_BYTES = 16 * 2**30  # the memory per training process from which the larger cache is set


def primitive_cache_capacity(memory_bytes: int, processes: int) -> int | None:
    """The oneDNN primitive cache this package asks for on a machine of `memory_bytes` running `processes` training
    processes: `LARGE_PRIMITIVE_CACHE` where each has `CACHE_MEMORY_BYTES`, else None (oneDNN's default)."""
    return LARGE_PRIMITIVE_CACHE if memory_bytes >= CACHE_MEMORY_BYTES * max(1, processes) else None


CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # v2, v1
LOCAL_PROCESS_COUNTS = (  # the training processes on this machine, as torchrun, accelerate and MPI launchers say
    "LOCAL_WORLD_SIZE",
    "MPI_LOCALNRANKS",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MV2_COMM_WORLD_LOCAL_SIZE",
)


def _total_memory_bytes() -> int:
    """The memory this process may use: the machine's, or its container's limit (cgroup v2 or v1) where lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
    for limit in CGROUP_LIMITS:
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def _local_processes() -> int:
    for name in LOCAL_PROCESS_COUNTS:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def use_large_primitive_cache() -> None:
    """Ask oneDNN for `LARGE_PRIMITIVE_CACHE` primitives where `primitive_cache_capacity` allows it (the memory of
    the machine or its container, the training processes the launcher says run on it) and the user has not set
    ONEDNN_PRIMITIVE_CACHE_CAPACITY or its older name DNNL_PRIMITIVE_CACHE_CAPACITY (read when oneDNN creates its
    first primitive)."""
    if PRIMITIVE_CACHE in os.environ or "DNNL_PRIMITIVE_CACHE_CAPACITY" in os.environ:  # the user's, either name
        return
    capacity = primitive_cache_capacity(_total_memory_bytes(), _local_processes())
    if capacity is not None:
        os.environ[PRIMITIVE_CACHE] = str(capacity)


def use_fast_allocator() -> None:
    """Re-run this process with mimalloc preloaded (Linux only; see the module docstring), with a larger oneDNN
    primitive cache where the machine's memory allows it. Call it first thing."""
    use_large_primitive_cache()
    if sys.platform != "linux" or os.environ.get("HF_VANILLA_TRANSFORMER_ALLOCATOR") == "system":
        return
    preloaded = os.environ.get("LD_PRELOAD", "")
    if any(name in preloaded for name in ("mimalloc", "tcmalloc", "jemalloc")):
        return
    library = mimalloc_library()
    if library is None:
        return
    environment = dict(os.environ)
    environment["LD_PRELOAD"] = f"{library}:{preloaded}" if preloaded else str(library)
    environment.setdefault("MIMALLOC_PURGE_DELAY", "-1")  # keep freed pages for the next step
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment)
