"""The data cache: every corpus, tokenizer and tokenized split is prepared once per machine and kept in memory-mapped
Arrow files under the data cache folder (`HF_VANILLA_TRANSFORMER_DATA`, default `~/.cache/hf_vanilla_transformer`,
or `--data_cache_dir`), in a folder named by a key of what it was made from:

    corpora/<key of the files' content>/{train,validation,test}.arrow      local parallel files
    libreoffice-help-en-<lang>/, libreoffice-ui-messages-en-<lang>/        the LibreOffice corpora ...
    libreoffice-help-ui-en-<lang>-joined/<key of the two and the rule>/    ... and the two together
    debs/<package>/                                                        their Debian packages
    tokenizers/<key of the corpus and the BPE settings>/tokenizer.json    learned shared BPEs
    tokenized/<key of the corpus>/<key of the tokenizer and max_length>/   tokenized splits with their lengths

A folder appears whole or not at all (written under a temporary name, then renamed), so a run killed while
preparing leaves nothing that looks complete; a second run, a resume or another process of the launch finds it and
reads it instead of preparing it again. A job that prepares an entry holds its lock (`<cache>/.locks/`); a second job
that wants the same entry meanwhile waits for it, then reads it. Where the file system has no working locks (some
shared storage), two jobs may each write their own temporary folder: the first to finish publishes it, the other
keeps the first's. Each folder holds a manifest of its files'
sizes and CRC-32s, checked whenever it is opened (a file's bytes read again whenever it was written, replaced or
copied since its last check): a truncated file, a changed byte or a missing file is said in the log and the entry
is built again, never read. Each corpus keeps its `KEEP_TOKENIZED` newest tokenizations; older ones are
removed, so the cache does not grow with every vocabulary tried.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import socket
import time
import zlib
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
from datasets import Dataset
from datasets.table import MemoryMappedTable

from ..utils.files import disk_full, folder_bytes, is_disk_full, write_text_atomically
from ..utils.locks import preparing
from ..utils.machine import release_mapped_pages


DEFAULT_CACHE = Path(os.environ.get("HF_VANILLA_TRANSFORMER_DATA", Path.home() / ".cache" / "hf_vanilla_transformer"))


logger = logging.getLogger(__name__)

KEEP_TOKENIZED = 2  # tokenizations kept per corpus
MANIFEST = "manifest.json"  # each file's size and CRC-32, written last before the folder is published
CHECKED = "checked.json"  # the signatures of the files as they were when last found intact (`damage`)
RACY_NS = 2_000_000_000  # a file changed this little before a check is checked again next time (`damage`)
HASH_CHUNK = 1 << 23  # bytes read at a time when hashing a file


def cache_root(cache_dir: str | Path | None = None) -> Path:
    return Path(cache_dir or DEFAULT_CACHE)


def text_key(*parts) -> str:
    """A short stable key of `parts` (anything JSON can write)."""
    return hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode("utf-8"), digest_size=10).hexdigest()


def files_key(paths: list[str | Path], *settings, cache_dir: str | Path | None = None) -> str:
    """A key of the content of `paths` (every byte hashed) and of `settings`: the same files give the same key
    wherever they lie; a changed byte gives another. Each file's hash is kept in the data cache (`KEYS`) with the
    file's signature (`file_signature`): a file read again unchanged (a second run on a 9 GB corpus) is not hashed
    again, one written since (a new time of change) is."""
    return text_key([content_hash(Path(path), cache_dir) for path in paths], settings)


KEYS = ".keys"  # the content hashes of the local files read, by their path (`files_key`)


def content_hash(path: Path, cache_dir: str | Path | None = None) -> str:
    """The blake2b hash of `path`'s size and bytes, from the data cache where the file is as it was then."""
    where = str(path.resolve())
    memo = cache_root(cache_dir) / KEYS / f"{text_key(where)}.json"
    signature = file_signature(path)
    known = _read_json(memo)
    if known.get("signature") == signature and known.get("hash"):
        return known["hash"]
    began = time.time_ns()
    digest = hashlib.blake2b(digest_size=10)
    digest.update(str(signature[0]).encode())
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    if settled(path, signature, began):
        _write_json(memo, {"path": where, "signature": signature, "hash": digest.hexdigest()})
    return digest.hexdigest()


def file_signature(path: Path) -> list[int]:
    """What changes whenever a file's bytes are written (or the file is replaced, or copied elsewhere): its size,
    times of modification and of change (which no program sets back), inode and device."""
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev]


def settled(path: Path, signature: list[int], began: int) -> bool:
    """Whether what was read of `path` since `began` (time.time_ns()) may be recorded under `signature`: the file was
    not written while it was read, nor changed so lately before that a write right after could leave the same times
    (a file system's clock ticks coarsely)."""
    return file_signature(path) == signature and signature[2] < began - RACY_NS


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _write_json(path: Path, value: dict) -> None:
    """Write a record of the cache's own (a hash, a check) whole or not at all; a cache folder that cannot be written
    (read-only, full) only costs the work again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps(value) + "\n", sync=False)
    except OSError:
        pass


def dataset_key(dataset: Dataset) -> str | None:
    """A key of a split's content: its backing Arrow files (never rewritten in place: new content gets a new
    file; named by their folder and name, their size and time), the rows it selects of them, its columns. None for a split held in memory only (built in a test, say):
    it is not cached."""
    files = [entry["filename"] for entry in dataset.cache_files]
    if not files:
        return None
    # A file by its name and its folder's (a cached corpus's folder is named by a key of its content), so that a data
    # cache copied elsewhere (modification times kept: `cp -a`, `shutil.copytree`) keeps its keys.
    stats = [
        (f"{Path(name).parent.name}/{Path(name).name}", os.path.getsize(name), os.stat(name).st_mtime_ns)
        for name in sorted(files)
    ]
    # The fingerprint follows every transform of the files' table (which column became `source`, which rows a
    # selection keeps) and is the same in every process that loads the same files.
    return text_key(stats, dataset.num_rows, dataset.column_names, dataset._fingerprint)


def open_arrow(path: str | Path) -> Dataset:
    """An Arrow file of the cache, memory-mapped, as a Dataset fingerprinted by the file (its folder's name, its own,
    its size and time) rather than by its place: datasets' own fingerprint of a file hashes its absolute path, so a
    cache copied or mounted elsewhere would key its tokenizers and tokenizations anew and prepare them again.

    Opening reads every record batch's header through the map, and a kernel that holds the file in large folios
    (2 MB: `FileHugePages` in /proc/meminfo) maps the whole folio around each (0.8 GB for the 720 headers of a 36M-
    pair corpus): the headers' pages are unmapped every `HEADERS_MAPPED` batches and at the end
    (`release_mapped_pages`), so opening a corpus holds a few tens of MB of it, not its headers' folios."""
    path = Path(path)
    stat = path.stat()
    return Dataset(
        MemoryMappedTable(read_arrow_table(path), str(path)),
        fingerprint=text_key(path.parent.name, path.name, stat.st_size, stat.st_mtime_ns),
    )


HEADERS_MAPPED = 32  # record batches read between two unmappings of their headers' pages (`read_arrow_table`)


def read_arrow_table(path: str | Path) -> pa.Table:
    """The table of an Arrow stream file, memory-mapped (zero copy), the pages of its record batches' headers
    unmapped every `HEADERS_MAPPED` batches as they are read (see `open_arrow`)."""
    reader = pa.ipc.open_stream(pa.memory_map(str(path)))
    batches = []
    for batch in reader:
        batches.append(batch)
        if len(batches) % HEADERS_MAPPED == 0:
            release_mapped_pages()
    release_mapped_pages()
    return pa.Table.from_batches(batches, schema=reader.schema)


@contextmanager
def headers_read_lightly():
    """While the block runs, a memory-mapped split that `datasets` opens again (a Dataset unpickled in a worker of
    `Dataset.map(num_proc=...)`, or in the BPE's child) reads its headers as `read_arrow_table` does: each worker
    would otherwise map the large folios around every header (1.4 GB of a 36M-pair corpus in each) before its
    first batch. Forked workers inherit it; where `datasets` has no such function, nothing changes."""
    import datasets.table

    name = "_memory_mapped_arrow_table_from_file"
    original = getattr(datasets.table, name, None)
    if original is None:
        yield
        return
    setattr(datasets.table, name, read_arrow_table)
    try:
        yield
    finally:
        setattr(datasets.table, name, original)


LOCKS = ".locks"  # the entries' locks, beside the kinds of entry
SCRATCH = ".scratch"  # unlinked files of a large split's file-backed arrays (`data.batching.scratch_array`)


def entry_lock(folder: Path, cache_dir: str | Path | None = None):
    """The lock of the cache entry `folder` (a context: see `utils.locks.preparing`); hold it from the check of the
    entry to its publication."""
    root = cache_root(cache_dir)
    return preparing(root / LOCKS / ("-".join(folder.relative_to(root).parts) + ".lock"), folder, logger)


def complete_folder(path: Path) -> Path | None:
    """`path` if a whole, intact cached folder is there, else None; a damaged one (`damage`) is said in the log and
    removed, for the caller to build again."""
    if not path.is_dir():
        return None
    problem = damage(path)
    if problem is None:
        return path
    logger.warning("the cached %s is damaged (%s): it is built again", path, problem)
    # Renamed aside first (a rename is whole or nothing), then removed: what a removal cannot delete (an open file
    # on NFS, a file of another user) stays aside, never where the entry is read.
    aside = path.with_name(f"{path.name}.damaged-{os.getpid()}-{secrets.token_hex(4)}")
    path.rename(aside)
    shutil.rmtree(aside, ignore_errors=True)
    return None


def damage(folder: Path) -> str | None:
    """What is wrong with the cached `folder` against its manifest, in words; None where nothing is. A folder
    without a manifest is damaged too: copied in part, or written by a version before manifests. A file's CRC-32
    is checked whenever its signature (`file_signature`) differs from the one recorded when it was last found
    intact (`CHECKED`): a file written since, replaced, or copied elsewhere is read whole again; one unchanged since
    its last check (a warm run on 13 GB of corpus and tokenization) is not."""
    manifest = folder / MANIFEST
    if not manifest.exists():
        return f"{manifest} is missing"
    try:
        expected = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return f"{manifest} cannot be read: {error}"
    checked, recorded = _read_json(folder / CHECKED), {}
    began = time.time_ns()
    for name, (size, crc) in expected.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != size:
            return f"{path} holds {path.stat().st_size:,} bytes where {size:,} were written"
        signature = file_signature(path)
        if checked.get(name) != signature:
            if file_crc(path) != crc:
                return f"{path} does not hold the bytes that were written (its CRC-32 differs)"
            if settled(path, signature, began):
                recorded[name] = signature
    if recorded:
        _write_json(folder / CHECKED, {**checked, **recorded})
    return None


def file_crc(path: Path) -> int:
    crc = 0
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def write_manifest(folder: Path) -> None:
    """Record every file of `folder` (its size and CRC-32), for `damage` to check against, and their signatures as
    checked (they were just read whole, in a folder no other process writes)."""
    files = sorted(path for path in folder.rglob("*") if path.is_file() and path.name not in (MANIFEST, CHECKED))
    signatures = {str(path.relative_to(folder)): file_signature(path) for path in files}
    entries = {name: [signature[0], file_crc(folder / name)] for name, signature in signatures.items()}
    (folder / MANIFEST).write_text(json.dumps(entries, indent=0) + "\n", encoding="utf-8")
    unchanged = {
        name: signature for name, signature in signatures.items() if file_signature(folder / name) == signature
    }
    _write_json(folder / CHECKED, unchanged)


def publish_folder(temporary: Path, path: Path) -> Path:
    """Move a folder written at `temporary` into place at `path`; if another process published it meanwhile, keep
    theirs (the same content) and drop ours."""
    write_manifest(temporary)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        temporary.rename(path)
    except OSError:
        shutil.rmtree(temporary, ignore_errors=True)
        if not path.is_dir():  # not another process that was first: a real failure
            raise
    return path


def temporary_folder(path: Path) -> Path:
    """A fresh folder beside `path` to write it in, `<name>.tmp-<host>_<where>-<pid>-<random>`: unique to this process
    on this machine (a cache folder may be shared storage). Those that a dead process left for the same `path` are
    removed where they provably come from here (`process_space`: the same kernel, booted once, and the same process
    ids), never another machine's or container's, even one with the same host name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    where = process_space()
    host = socket.gethostname().replace("-", "_")
    if where is not None:
        for leftover in path.parent.glob(f"{path.name}.tmp-{host}_{where}-*"):
            pid = leftover.name.split("-")[-2]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(leftover, ignore_errors=True)
    temporary = path.with_name(f"{path.name}.tmp-{host}_{where or 'unknown'}-{os.getpid()}-{secrets.token_hex(4)}")
    temporary.mkdir()
    return temporary


def process_space() -> str | None:
    """A key of where this process's id names this process: the kernel's boot id (random at every boot, so another
    machine's differs) and the process-id namespace (a container has its own: two containers on one kernel number
    their processes apart). None where the system does not say (no /proc): leftovers are then never removed."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
        namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return None
    return text_key(boot, namespace)[:12]


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
    in the block leaves nothing behind (a full device is named: `DiskFullError`)."""
    temporary = temporary_folder(path)
    try:
        yield temporary
        publish_folder(temporary, path)
    except BaseException as error:
        written = folder_bytes(temporary)
        full = isinstance(error, Exception) and is_disk_full(error, path.parent)  # the free space before clean-up
        shutil.rmtree(temporary, ignore_errors=True)
        if full:
            raise disk_full(path.parent, 2 * written or None, f"the cached {path.name}") from error
        raise


def prune(folder: Path, keep: int = KEEP_TOKENIZED, idle_seconds: float = 3600.0) -> list[Path]:
    """Remove all but the `keep` most recently used entries of `folder`, and of those only entries unused for
    `idle_seconds` (another run may have just found one); temporary folders are left alone. Returns what went."""
    if not folder.is_dir():
        return []
    used = {entry: _used(entry) for entry in folder.iterdir() if ".tmp-" not in entry.name}
    entries = sorted((entry for entry in used if used[entry] is not None), key=used.get, reverse=True)
    now = time.time()
    removed = [entry for entry in entries[keep:] if now - used[entry] > idle_seconds]
    for entry in removed:
        shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    return removed


def _used(entry: Path) -> float | None:
    """When `entry` was last used (its time of modification), None where it is gone: another job pruned it."""
    try:
        return entry.stat().st_mtime
    except FileNotFoundError:
        return None


def touch(path: Path) -> None:
    """Mark `path` as just used (for `prune`)."""
    os.utime(path)
