"""The data cache: every corpus, tokenizer and tokenized split is prepared once per machine and kept in memory-mapped
Arrow files under the data cache folder (`HF_VANILLA_TRANSFORMER_DATA`, default `~/.cache/hf_vanilla_transformer`,
or `--data_cache_dir`), in a folder named by a key of what it was made from:

    corpora/<key of the files' content>/{train,validation,test}.arrow      local parallel files
    tokenizers/<key of the corpus and the BPE settings>/tokenizer.json    learned shared BPEs
    tokenized/<key of the corpus>/<key of the tokenizer and max_length>/   tokenized splits with their lengths

A folder appears whole or not at all (written under a temporary name, then renamed), so a run killed while
preparing leaves nothing that looks complete; a second run, a resume or another process of the launch finds it and
reads it instead of preparing it again. Each corpus keeps its `KEEP_TOKENIZED` newest tokenizations; older ones are
removed, so the cache does not grow with every vocabulary tried.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from datasets import Dataset

from .errors import DEFAULT_CACHE


KEEP_TOKENIZED = 2  # tokenizations kept per corpus
HASH_CHUNK = 1 << 23  # bytes read at a time when hashing a file


def cache_root(cache_dir: str | Path | None = None) -> Path:
    return Path(cache_dir or DEFAULT_CACHE)


def text_key(*parts) -> str:
    """A short stable key of `parts` (anything JSON can write)."""
    return hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode("utf-8"), digest_size=10).hexdigest()


def files_key(paths: list[str | Path], *settings) -> str:
    """A key of the content of `paths` (every byte hashed) and of `settings`: the same files give the same key
    wherever they lie; a changed byte gives another."""
    digest = hashlib.blake2b(digest_size=10)
    for path in paths:
        digest.update(str(os.path.getsize(path)).encode())
        with open(path, "rb") as handle:
            while chunk := handle.read(HASH_CHUNK):
                digest.update(chunk)
    digest.update(json.dumps(settings, default=str).encode())
    return digest.hexdigest()


def dataset_key(dataset: Dataset) -> str | None:
    """A key of a split's content: its backing Arrow files (never rewritten in place: new content gets a new
    file), the rows it selects of them, its columns. None for a split held in memory only (built in a test, say):
    it is not cached."""
    files = [entry["filename"] for entry in dataset.cache_files]
    if not files:
        return None
    stats = [(name, os.path.getsize(name), os.stat(name).st_mtime_ns) for name in sorted(files)]
    selected = None
    if dataset._indices is not None:  # a selection of the rows (hold_out): a key of which
        indices = dataset._indices.column(0).combine_chunks()
        selected = hashlib.blake2b(indices.buffers()[1], digest_size=10).hexdigest()
    return text_key(stats, dataset.num_rows, dataset.column_names, selected)


def complete_folder(path: Path) -> Path | None:
    """`path` if a whole cached folder is there, else None."""
    return path if path.is_dir() else None


def publish_folder(temporary: Path, path: Path) -> Path:
    """Move a folder written at `temporary` into place at `path`; if another process published it meanwhile, keep
    theirs (the same content) and drop ours."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        temporary.rename(path)
    except OSError:  # the folder exists: another process of the launch was first
        shutil.rmtree(temporary, ignore_errors=True)
    return path


def temporary_folder(path: Path) -> Path:
    """A fresh folder beside `path` to write it in, unique to this process; those a killed process left for the
    same `path` are removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for leftover in path.parent.glob(f"{path.name}.tmp-*"):
        pid = leftover.name.rsplit("-", 1)[-1]
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            shutil.rmtree(leftover, ignore_errors=True)
    temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    temporary.mkdir()
    return temporary


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@contextmanager
def building(path: Path):
    """Write the cached folder `path` inside the block (into the folder it yields), then publish it whole; an error
    in the block leaves nothing behind."""
    temporary = temporary_folder(path)
    try:
        yield temporary
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    publish_folder(temporary, path)


def prune(folder: Path, keep: int = KEEP_TOKENIZED) -> list[Path]:
    """Remove all but the `keep` most recently used entries of `folder` (temporary folders of live processes are
    left alone); returns what was removed."""
    if not folder.is_dir():
        return []
    entries = sorted(
        (entry for entry in folder.iterdir() if ".tmp-" not in entry.name),
        key=lambda entry: entry.stat().st_mtime,
        reverse=True,
    )
    removed = entries[keep:]
    for entry in removed:
        shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    return removed


def touch(path: Path) -> None:
    """Mark `path` as just used (for `prune`)."""
    os.utime(path)
