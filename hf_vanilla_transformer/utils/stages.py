"""The set-up of a run, stage by stage: how long each took and the process's peak memory after it (and its memory
then, its own apart from mapped files: `utils.machine.memory_now`), logged as it
goes, kept in `results.json` ("setup") and, for every process of a launch, in `setup-rank<N>.json` in the output
folder (the scale benchmark reads them). The last entry is the first update, counted from the process's start."""

from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .machine import children_peak_rss_bytes, mapped_bytes, memory_now, peak_rss_bytes


logger = logging.getLogger(__name__)


@dataclass
class SetupClock:
    """Stages of this process's set-up; `started` is the process's start (time.time() scale)."""

    started: float
    rank: int = 0
    stages: dict[str, dict] = field(default_factory=dict)
    at_start: dict[str, int] = field(default_factory=memory_now)  # before any data: the interpreter and libraries

    @contextmanager
    def stage(self, name: str):
        """Time the block as stage `name`; `note` adds facts to it."""
        began = time.time()
        self.stages[name] = {}
        yield self.stages[name]
        self.stages[name].update(
            seconds=time.time() - began,
            peak_rss_bytes=peak_rss_bytes(),
            children_peak_rss_bytes=children_peak_rss_bytes(),  # worker processes (the tokenizing map's)
            **memory_now(),
            **mapped_bytes(),
        )
        figures = self.stages[name]
        logger.info("%s: %.1f s (peak RSS %.2f GB)", name, figures["seconds"], figures["peak_rss_bytes"] / 2**30)

    def first_update(self) -> None:
        """Record the end of the first update, in seconds since the process started."""
        self.stages["first update"] = {
            "since_start_seconds": time.time() - self.started,
            "peak_rss_bytes": peak_rss_bytes(),
            **memory_now(),
            **mapped_bytes(),
        }

    def to_dict(self) -> dict:
        return {"rank": self.rank, "at_start": self.at_start, "stages": self.stages}

    def write(self, folder: str | Path) -> Path:
        path = Path(folder) / f"setup-rank{self.rank}.json"
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path
