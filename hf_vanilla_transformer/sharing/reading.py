"""What `push` reads of a model folder, and how: regular files inside the folder only.

A folder received from someone else keeps its links (tar does): `training_log.json -> ~/.cache/huggingface/token`
would publish the user's token under an innocent name. So every file is opened relative to the folder, each folder on
the way and the file itself without following a symbolic link (`O_NOFOLLOW`), and checked on the open descriptor: a
regular file (not a pipe, whose opening could wait forever, nor a device), and one whose every name lies inside the
folder (a hard link to a file outside is a second name of it: refused where the folder does not hold them all). The
JSON files are read with a bound and parsed; `training_log.json` only as the run writes it. A file refused is a
`RefusedFile` whose one-line message names it and says why.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
from collections import Counter
from pathlib import Path


FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A file: never through a link; O_NONBLOCK so that a named pipe in a file's place opens at once (and is refused).
FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
LONGEST_TEXT = 64 << 20  # bytes of a JSON file or a card read at most: a run's are kilobytes
PNG = b"\x89PNG\r\n\x1a\n"
# A name in training_log.json: what the Trainer and this package log (loss, eval_bleu, train_samples_per_second, ...).
LOG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,99}")
KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))


class RefusedFile(ValueError):
    """A file of a model folder that push does not read: the message names it and says why."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"{name} is {reason}")
        self.name = name


class ModelFolder:
    """A model folder open for reading (`open_model_folder`; close it, or use it in a `with`): its files by their
    '/'-separated names inside it, each only as a regular file inside the folder."""

    def __init__(self, path: Path, descriptor: int):
        self.path, self.descriptor = path, descriptor
        self._names: Counter | None = None  # (device, inode) -> names inside the folder, counted when first needed

    def __enter__(self) -> ModelFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        os.close(self.descriptor)

    def exists(self, name: str) -> bool:
        """Whether something (a link included, to be refused when read) has the name `name` in the folder."""
        try:
            os.stat(name, dir_fd=self.descriptor, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def open(self, name: str) -> int:
        """A read descriptor of the regular file `name`; FileNotFoundError where there is none, RefusedFile where
        it is, or is reached through, a link, or is no regular file with all its names inside the folder."""
        *folders, leaf = name.split("/")
        parent, opened = self.descriptor, []
        try:
            for index, part in enumerate(folders):
                parent = _open_at(part, FOLDER, parent, "/".join(folders[: index + 1]))
                opened.append(parent)
            descriptor = _open_at(leaf, FILE, parent, name)
        finally:
            for folder in opened:
                os.close(folder)
        try:
            self._check(os.fstat(descriptor), name)
        except RefusedFile:
            os.close(descriptor)
            raise
        return descriptor

    def _check(self, found: os.stat_result, name: str) -> None:
        kind = next((what for test, what in KINDS if test(found.st_mode)), "a device")
        if not stat.S_ISREG(found.st_mode):
            raise RefusedFile(name, f"{kind}, not a regular file")
        if found.st_nlink > 1:
            if self._names is None:
                self._names = names_inside(self.descriptor)
            inside = self._names[(found.st_dev, found.st_ino)]
            if inside < found.st_nlink:
                raise RefusedFile(
                    name,
                    f"a file with {found.st_nlink} names (hard links), {found.st_nlink - inside} of them outside "
                    "the folder; push reads only files whose every name is inside it",
                )

    def copy(self, name: str, destination: Path, starts_with: bytes = b"") -> int:
        """Copy the file `name` (see `open`) to `destination`; returns its size. `starts_with`: the bytes its kind
        of file begins with (a PNG's signature), refused otherwise."""
        with os.fdopen(self.open(name), "rb") as source:
            if source.read(len(starts_with)) != starts_with:
                raise RefusedFile(name, f"not the kind of file its name says (it does not begin with {starts_with!r})")
            source.seek(0)
            with open(destination, "wb") as target:
                shutil.copyfileobj(source, target, 1 << 20)
                return target.tell()

    def text(self, name: str) -> str:
        """The UTF-8 text of the file `name` (see `open`), of at most `LONGEST_TEXT` bytes."""
        with os.fdopen(self.open(name), "rb") as source:
            data = source.read(LONGEST_TEXT + 1)
        if len(data) > LONGEST_TEXT:
            raise RefusedFile(name, f"over {LONGEST_TEXT:,} bytes, more than a model folder's {name} holds")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RefusedFile(name, f"not UTF-8 text ({error.reason} at byte {error.start:,})") from None

    def json(self, name: str) -> dict:
        """The JSON object of the file `name` (see `text` and `json_object`)."""
        return json_object(name, self.text(name))

    def names(self, folder: str) -> list[str]:
        """The names of the entries of the subfolder `folder` (none where it does not exist), sorted; RefusedFile
        where it is a link or no folder."""
        try:
            descriptor = _open_at(folder, FOLDER, self.descriptor, folder)
        except FileNotFoundError:
            return []
        try:
            return sorted(entry.name for entry in os.scandir(descriptor))
        finally:
            os.close(descriptor)


def json_object(name: str, text: str) -> dict:
    """The JSON object `text` of the file `name`; RefusedFile where it is no JSON object."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        reason = "nested too deep" if isinstance(error, RecursionError) else str(error)
        raise RefusedFile(name, f"not JSON ({reason})") from None
    if not isinstance(value, dict):
        raise RefusedFile(name, f"a JSON {type(value).__name__}, not the object the run writes")
    return value


def open_model_folder(path: str | Path) -> ModelFolder:
    """The folder `path` open for reading (the path itself as the user names it, a link to it included: the links
    that matter are those inside). NotADirectoryError or FileNotFoundError where it is no folder."""
    return ModelFolder(Path(path), os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))


def _open_at(name: str, flags: int, parent: int, shown: str) -> int:
    """`os.open(name, flags, dir_fd=parent)`, a symbolic link (ELOOP; ENOTDIR for a folder) or a file where a folder
    was wanted (ENOTDIR) refused under the name `shown`."""
    try:
        return os.open(name, flags, dir_fd=parent)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
            target = os.readlink(name, dir_fd=parent)
            raise RefusedFile(
                shown, f"a symbolic link (to {target}); push reads only regular files inside the model folder"
            ) from None
        if error.errno == errno.ENOTDIR and flags & os.O_DIRECTORY:
            raise RefusedFile(shown, "not a folder") from None
        raise


def names_inside(descriptor: int) -> Counter:
    """(device, inode) -> how many names each file with several names has inside the folder open as `descriptor`,
    its subfolders included, no link followed."""
    counts: Counter = Counter()
    for _, _, files, folder in os.fwalk(".", dir_fd=descriptor, follow_symlinks=False):
        for name in files:
            found = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if stat.S_ISREG(found.st_mode) and found.st_nlink > 1:
                counts[(found.st_dev, found.st_ino)] += 1
    return counts


def training_log(data: dict) -> dict:
    """`training_log.json` (parsed) as the run writes it: `{"log_history": [{name: number or null, ...}, ...]}`, the
    Trainer's log history; a ValueError saying where it differs otherwise."""
    if set(data) != {"log_history"} or not isinstance(data["log_history"], list):
        raise ValueError(f"an object of {len(data)} keys, not {{'log_history': [...]}}")
    for number, entry in enumerate(data["log_history"], start=1):
        if not isinstance(entry, dict):
            raise ValueError(f"log_history's entry {number} is a {type(entry).__name__}, not an object")
        for key, value in entry.items():
            if not LOG_NAME.fullmatch(key):
                raise ValueError(f"log_history's entry {number} holds a key that names no logged value")
            if isinstance(value, bool) or not isinstance(value, (int, float, type(None))):
                raise ValueError(
                    f"log_history's entry {number} holds a {type(value).__name__} at {key!r}, not a number"
                )
    return data
