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
import secrets
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from datasets import Dataset


DEFAULT_CACHE = Path(os.environ.get("HF_VANILLA_TRANSFORMER_DATA", Path.home() / ".cache" / "hf_vanilla_transformer"))


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
    # The fingerprint follows every transform of the files' table (which column became `source`, which rows a
    # selection keeps) and is the same in every process that loads the same files.
    return text_key(stats, dataset.num_rows, dataset.column_names, dataset._fingerprint)


def complete_folder(path: Path) -> Path | None:
    """`path` if a whole cached folder is there, else None."""
    return path if path.is_dir() else None


def publish_folder(temporary: Path, path: Path) -> Path:
    """Move a folder written at `temporary` into place at `path`; if another process published it meanwhile, keep
    theirs (the same content) and drop ours."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        temporary.rename(path)
    except OSError:
        shutil.rmtree(temporary, ignore_errors=True)
        if not path.is_dir():  # not another process that was first: a real failure
            raise
    return path


def temporary_folder(path: Path) -> Path:
    """A fresh folder beside `path` to write it in, unique to this process on this machine (a cache folder may be
    shared storage); those a killed process of this machine left for the same `path` are removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().replace("-", "_")
    for leftover in path.parent.glob(f"{path.name}.tmp-{host}-*"):
        pid = leftover.name.split("-")[-2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)
    temporary = path.with_name(f"{path.name}.tmp-{host}-{os.getpid()}-{secrets.token_hex(4)}")
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


def prune(folder: Path, keep: int = KEEP_TOKENIZED, idle_seconds: float = 3600.0) -> list[Path]:
    """Remove all but the `keep` most recently used entries of `folder`, and of those only entries unused for
    `idle_seconds` (another run may have just found one); temporary folders are left alone. Returns what went."""
    if not folder.is_dir():
        return []
    entries = sorted(
        (entry for entry in folder.iterdir() if ".tmp-" not in entry.name),
        key=lambda entry: entry.stat().st_mtime,
        reverse=True,
    )
    now = time.time()
    removed = [entry for entry in entries[keep:] if now - entry.stat().st_mtime > idle_seconds]
    for entry in removed:
        shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    return removed


def touch(path: Path) -> None:
    """Mark `path` as just used (for `prune`)."""
    os.utime(path)
