"""What every corpus shares: the split names, the cache folder, and the error that says a corpus cannot be built."""

from __future__ import annotations

import os
from pathlib import Path


SPLITS = ("train", "validation", "test")
DEFAULT_CACHE = Path(os.environ.get("HF_VANILLA_TRANSFORMER_DATA", Path.home() / ".cache" / "hf_vanilla_transformer"))


class CorpusError(RuntimeError):
    """A corpus cannot be built here; the message says what to run or which source to use instead."""
