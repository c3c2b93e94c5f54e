"""Named moments of a run where the fault-injection suite (tests/test_faults.py) strikes, each where the run writes
something it reads back later.

* `HF_VANILLA_TRANSFORMER_KILL_AT=<moment>[:<n>]`: the process that reaches the moment for the n-th time (default
  the first) kills its process group with SIGKILL (the suite starts each run in a session of its own: the run, its
  BPE child, its data workers), as a preempted node or an out-of-memory killer would: no handler runs, no file is
  closed.
* `HF_VANILLA_TRANSFORMER_FILL_AT=<moment>[:<n>]`: there, the device of the folder being written is filled up (a
  file `FILLER` at its mount point takes all the space left), so that the next write fails as on a full disk.

Without the variables, `moment()` reads two environment variables and returns.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path


KILL, FILL = "HF_VANILLA_TRANSFORMER_KILL_AT", "HF_VANILLA_TRANSFORMER_FILL_AT"
FILLER = "disk-filler"
MOMENTS = {
    "corpus": "writing a local corpus into the data cache",
    "bpe": "learning the BPE (in the forked child)",
    "tokenize": "writing the tokenized training split into the data cache",
    "plan": "writing budget.json (its temporary file flushed, not yet renamed)",
    "update": "between two updates",
    "checkpoint-weights": "a checkpoint written up to its weights",
    "checkpoint-optimizer": "a checkpoint written up to its optimizer state",
    "checkpoint-marker": "a checkpoint written whole, before its completion marker",
    "replan": "writing a re-planned budget.json (its temporary file flushed, not yet renamed)",
    "validation": "in a validation, after its decoding",
    "averaging": "writing the averaged model (its weights written, its tokenizer not yet)",
    "model-folder": "writing the model folder",
    "card": "writing the model card (its temporary file flushed, not yet renamed)",
    "plots": "drawing the plots (the first written, the others not yet)",
}
_reached: dict[str, int] = {}


def moment(name: str, folder: str | Path | None = None) -> None:
    """Mark the moment `name` (one of `MOMENTS`), where `folder` is being written; strike here where the
    environment asks for it."""
    kill, fill = _asked(KILL, name), _asked(FILL, name)
    if kill is None and fill is None:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if kill == _reached[name]:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    if fill == _reached[name] and folder is not None:
        fill_device(Path(folder))


def _asked(variable: str, name: str) -> int | None:
    """The count at which `variable` asks to strike at moment `name`, or None."""
    target, _, count = os.environ.get(variable, "").partition(":")
    return int(count or 1) if target == name else None


def fill_device(folder: Path) -> Path:
    """Take all the space left on `folder`'s device with one file (`FILLER` at the device's mount point: the other
    data of a full disk, which the run's clean-up of what it was writing does not free)."""
    folder.mkdir(parents=True, exist_ok=True)
    mount = folder.resolve()
    while not os.path.ismount(mount):
        mount = mount.parent
    path = mount / FILLER
    with path.open("wb") as handle:
        free = shutil.disk_usage(folder).free
        try:
            os.posix_fallocate(handle.fileno(), 0, max(1, free))
        except OSError:  # what fallocate could not take, writes do, until the device says it is full
            block = b"\0" * (1 << 20)
            try:
                while True:
                    handle.write(block)
                    handle.flush()
            except OSError:
                pass
    return path
