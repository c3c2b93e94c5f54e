"""One run per output folder: the main process of a run holds `<output_dir>/.lock` (an exclusive `flock`) from its
start to its end, with its host, process id and start time written in it. A second run into the same folder is
refused with a message naming the one that holds it. A lock left by a run that was killed holds nothing: the
kernel releases a dead process's `flock`, so the next run takes it over (its file still names the dead run, and the
message of the take-over says so). On storage several machines share, `flock` is only as good as the file system's
support for it (NFS v4 has it). A lock file is opened without following a symbolic link and never truncated on
opening: a link, or a file with other names, at its place is refused (`LockFileError`), the file it points to left
as it is."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


LOCK = ".lock"

# The lock files this process holds open. A forked child (the BPE's, datasets.map's workers, the DataLoader's) shares
# their open file descriptions, and with them the `flock`s: each child closes its copies at once, so that the locks
# die with the process that took them, not with its last child.
_held: set = set()


def _close_in_child() -> None:
    for handle in _held:
        handle.close()
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


class FolderInUseError(RuntimeError):
    """Another run holds the folder; the message names it."""


class LockFileError(FolderInUseError):
    """A lock file that is no plain file of its own (a symbolic link, a file with other names, a pipe): refused, never
    followed nor emptied; the message names it. A `FolderInUseError`, so that every process of a launch stops with
    the main process's message (training/run.py) and the command says it in one line."""


# Read and write, created where missing, never truncated on opening (an existing file may be another's lock), never
# through a symbolic link (O_NOFOLLOW: ELOOP instead).
LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def open_lock_file(path: Path):
    """`path` opened as a lock file (text, read and write), created if missing; a `LockFileError` where it is a
    symbolic link or not a plain file with this one name."""
    try:
        descriptor = os.open(path, LOCK_FLAGS, 0o666)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise LockFileError(
            f"{path} is a symbolic link (to {os.readlink(path)}); a lock file is never opened through a link. "
            "Remove the link and run again."
        ) from None
    found = os.fstat(descriptor)
    if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
        os.close(descriptor)
        what = "not a plain file" if not stat.S_ISREG(found.st_mode) else f"a file with {found.st_nlink} names"
        raise LockFileError(f"{path} is {what}; a lock file is a plain file of its own. Remove it and run again.")
    return os.fdopen(descriptor, "r+", encoding="utf-8")


@contextmanager
def folder_lock(folder: str | Path, logger=None) -> Iterator[Path]:
    """Hold `folder`'s lock inside the block; a `FolderInUseError` names the process that holds it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK
    handle = open_lock_file(lock)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "another process"
        handle.close()
        raise FolderInUseError(
            f"{folder} is in use by another run ({owner}); wait for it to end, or give another --output_dir."
        ) from None
    handle.seek(0)
    before = handle.read().strip()
    if before and logger is not None:
        logger.info("%s was locked by a run that ended without releasing it (%s): taken over", folder, before)
    try:
        with _held_by_this_process(handle, f", since {time.strftime('%Y-%m-%d %H:%M:%S')}"):
            yield lock
    finally:
        handle.close()


@contextmanager
def preparing(lock: Path, what: Path, logger=None) -> Iterator[None]:
    """Hold `lock` while `what` (a cache entry) is checked and, if need be, prepared: a second job that wants the
    same entry waits (said in its log, naming the job that prepares it), then finds it complete and reads it instead
    of preparing it again. A job killed while preparing releases the lock with its death."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open_lock_file(lock) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "another process"
            if logger is not None:
                logger.info("waiting for %s, which prepares %s", owner, what)
            fcntl.flock(handle, fcntl.LOCK_EX)
        with _held_by_this_process(handle):
            yield


@contextmanager
def _held_by_this_process(handle, since: str = "") -> Iterator[None]:
    """A lock file just locked: named after this process (its host and id) while held, emptied and unlocked after
    (an empty lock file: nobody holds it)."""
    _held.add(handle)
    handle.seek(0)
    handle.truncate()
    handle.write(f"process {os.getpid()} on {socket.gethostname()}{since}\n")
    handle.flush()
    try:
        yield
    finally:
        _held.discard(handle)
        handle.seek(0)
        handle.truncate()
        fcntl.flock(handle, fcntl.LOCK_UN)
