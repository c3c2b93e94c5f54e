"""Process-level settings: a caching memory allocator for CPU training.

A training step frees and re-allocates the same large buffers (activations, logits, attention scores) of
ever-changing sizes. glibc's allocator returns them to the kernel and fragments its heap: on the 2-core machine
this package is developed on, a `small` model step took 0.55 s rising to 0.62 s over 240 steps with the process
growing from 3.3 to 5.1 GB, against a steady 0.37 s and 2.4 GB with mimalloc (`MIMALLOC_PURGE_DELAY=-1`, the
same with tcmalloc). The allocator changes no number the model computes.

`use_fast_allocator()` re-executes the current command with mimalloc preloaded, once, at the start of a script.
It does nothing where mimalloc is not installed (the `cmeel-mimalloc` wheel, a Linux dependency of this
package), where another allocator is already preloaded, or when `HF_VANILLA_TRANSFORMER_ALLOCATOR=system`.
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


def use_fast_allocator() -> None:
    """Re-run this process with mimalloc preloaded (Linux only; see the module docstring). Call it first thing."""
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
