"""Files and folders written so that an interruption at any moment never leaves one that looks complete: each is
written under a temporary name in the same folder, then renamed (`os.replace` is atomic on one file system)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


def write_text_atomically(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` through a temporary file renamed into place."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
    return path


def write_json_atomically(path: str | Path, data) -> Path:
    """`data` as indented JSON (non-ASCII kept), written atomically."""
    return write_text_atomically(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def replace_folder_atomically(path: str | Path, write) -> Path:
    """Build a folder with `write(temporary_folder)`, then rename it to `path`, replacing what was there: an
    interrupted build leaves only the temporary folder, which the next build removes first."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    if temporary.exists():
        shutil.rmtree(temporary)
    write(temporary)
    if path.exists():
        shutil.rmtree(path)
    temporary.rename(path)
    return path
