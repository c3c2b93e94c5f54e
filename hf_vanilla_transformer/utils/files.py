"""Files and folders written so that an interruption at any moment never leaves one that looks complete: each is
written under a temporary name in the same folder, flushed to the disk, then renamed (`os.replace` is atomic on one
file system); and a device that fills up while writing is named in one line (`DiskFullError`)."""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
from pathlib import Path

from .faults import moment


# A temporary file is always a new one: created here or not at all, never through a symbolic link.
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def create_temporary_file(path: str | Path) -> tuple[Path, int]:
    """(name, open descriptor for writing) of a new file beside `path`, named `<name>.tmp-<random>`: created with
    `O_EXCL | O_NOFOLLOW`, so that it is never a file or a symbolic link someone put there (a fixed name could be a
    link to any file of the user's, which writing would overwrite)."""
    path = Path(path)
    while True:
        temporary = path.with_name(f"{path.name}.tmp-{secrets.token_hex(6)}")
        try:
            return temporary, os.open(temporary, NEW_FILE, 0o666)  # the umask applies, as to any new file
        except FileExistsError:  # (one in 2^48: another name)
            continue


def write_text_atomically(path: str | Path, text: str, at: str | None = None, sync: bool = True) -> Path:
    """Write `text` (UTF-8) to `path` through a new temporary file (`create_temporary_file`) renamed into place; `at`
    names the fault suite's moment (utils/faults.py) between the two; `sync=False` skips flushing it to the disk
    first (a record that only costs work again if lost)."""
    path = Path(path)
    temporary, descriptor = create_temporary_file(path)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())  # the content is on the disk before the name points at it
        if at is not None:
            moment(at)
        os.replace(temporary, path)  # (a rename replaces a link at `path` itself, never the file it points to)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def sync_folder(folder: str | Path) -> None:
    """Flush every file under `folder`, and the folder itself, to the disk (before a marker says it is whole)."""
    folder = Path(folder)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_json_atomically(path: str | Path, data, at: str | None = None) -> Path:
    """`data` as indented JSON (non-ASCII kept), written atomically (`at`: see `write_text_atomically`)."""
    return write_text_atomically(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n", at=at)


NEARLY_FULL = 1 << 20  # bytes free under which a failed write is taken for a full device


class DiskFullError(OSError):
    """No space was left where a file was being written; the message names the folder, the space free there and
    about how much the write needed."""


# torch.save's words for a write that failed, whatever the cause (it gives no errno: "unexpected pos 64 vs 0")
WRITE_FAILED = ("file write failed", "unexpected pos", "PytorchStreamWriter failed")


def is_disk_full(error: BaseException, folder: str | Path | None = None) -> bool:
    """Whether `error` (or what caused it) comes of a full device: an OSError with ENOSPC or EDQUOT (a quota),
    the libraries' own words for them, or, where a writer says only that a write failed (`WRITE_FAILED`), such a
    failure with less than `NEARLY_FULL` bytes free on the device of `folder`. Any other error is not."""
    write_failed = False
    cause = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(cause)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        write_failed = write_failed or any(words in text for words in WRITE_FAILED)
        cause = cause.__cause__ or cause.__context__
    if not write_failed or folder is None:
        return False
    existing = next((parent for parent in (Path(folder), *Path(folder).parents) if parent.exists()), Path("/"))
    return shutil.disk_usage(existing).free < NEARLY_FULL


def disk_full(folder: str | Path, needed: int | None, writing: str) -> DiskFullError:
    """The error that says the device of `folder` filled up while `writing`, with the space free there and `needed`
    (bytes, about; None where it is not known)."""
    folder = Path(folder)
    existing = next((parent for parent in (folder, *folder.parents) if parent.exists()), Path("/"))
    free = shutil.disk_usage(existing).free
    wanted = f", about {human_bytes(needed)} needed" if needed else ""
    return DiskFullError(
        errno.ENOSPC,
        f"no space left on the device of {folder} while writing {writing}: {human_bytes(free)} free{wanted}. "
        "Free some space (or point the folder elsewhere) and run the same command again: it resumes",
    )


def folder_bytes(folder: str | Path) -> int:
    """The bytes of the files under `folder` (0 where it does not exist)."""
    return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())


def human_bytes(size: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
