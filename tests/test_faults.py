"""Faults survived: a real run of the tiny preset through scripts/train.py, in a child process of its own session,
killed with SIGKILL at 20 moments over the whole run (utils/faults.py names them) and run again with the same
command; a full device while writing a checkpoint, the data cache and the model folder; two runs into one output
folder, and a lock left by a killed run; two jobs preparing one corpus at once; damaged caches; bad lines of data;
bad flags. Each run ends as the test says, and the model folder of every killed and resumed run holds the weights
of an uninterrupted one, bit for bit. The suite writes what it found to $HF_VANILLA_TRANSFORMER_FAULT_REPORT
(docs/reliability.md is its table)."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_vanilla_transformer.data.cache import building, dataset_key, entry_lock
from hf_vanilla_transformer.data.corpora import SKIPPED, SKIPPED_FILE, parallel_files_corpus, write_pairs
from hf_vanilla_transformer.training.checkpoints import checkpoint_folders, validate_checkpoint
from hf_vanilla_transformer.utils.faults import FILLER, MOMENTS
from hf_vanilla_transformer.utils.files import is_disk_full
from hf_vanilla_transformer.utils.locks import folder_lock

from conftest import FIXTURES, ROOT


TRAIN = FIXTURES / "libreoffice_help_en_de_200.tsv"
HELD_OUT = FIXTURES / "libreoffice_help_en_de_test_40.tsv"
REPORT = os.environ.get("HF_VANILLA_TRANSFORMER_FAULT_REPORT")


def command(output: Path, cache: Path, *extra: str) -> list[str]:
    """A 40-update run of the tiny preset: checkpoints every 10 updates, validation every 20, the last 3 averaged."""
    return [
        sys.executable,
        str(ROOT / "scripts" / "train.py"),
        *("--preset", "tiny", "--max_steps", "40", "--save_steps", "10", "--output_dir", str(output)),
        *("--data_files", str(TRAIN), "--validation_files", str(HELD_OUT), "--test_files", str(HELD_OUT)),
        *("--vocab_size", "500", "--average_last", "3", "--average_window", "1", "--test_beams", "2"),
        *("--eval_strategy", "steps", "--eval_steps", "20", "--max_eval_samples", "10", "--generation_num_beams", "1"),
        *("--length_penalty_choices", "0.6,1.0", "--data_cache_dir", str(cache), "--disable_tqdm", "true"),
        *("--source_check", "warn", "--dataloader_num_workers", "0", "--seed", "7"),
        *extra,
    ]


def run(arguments: list[str], timeout: int = 600, **environment) -> subprocess.CompletedProcess:
    """The command in a session of its own (a fault kills its whole group: the run, its BPE child, its workers)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_VANILLA_TRANSFORMER_ALLOCATOR": "system", **environment}
    return subprocess.run(arguments, capture_output=True, text=True, timeout=timeout, env=env, start_new_session=True)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def assert_complete_and_equal(folder: Path, reference: Path) -> None:
    """A complete model folder (results.json is written last) holding the reference run's weights, bit for bit."""
    for name in ("results.json", "README.md", "tokenizer.json", "generation_config.json", "plots"):
        assert (folder / name).exists(), name
    expected, found = weights(reference), weights(folder)
    assert found.keys() == expected.keys()
    for key in expected:
        assert torch.equal(found[key], expected[key]), key


def record(kind: str, **facts) -> None:
    if REPORT:
        with open(REPORT, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"kind": kind, **facts}) + "\n")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    """An uninterrupted run (its model folder) and the data cache it filled, which the kills after set-up share."""
    root = tmp_path_factory.mktemp("reference")
    result = run(command(root / "run", root / "cache"))
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "run", root / "cache"


# Where the kills strike: every moment of utils/faults.py (the re-plan, which only a budgeted run makes, apart), some
# at several occurrences of the 40-update run (checkpoints at 10, 20, 30 and 40, validations at 20 and 40, each
# before its checkpoint). The kills come in chains: each run again after a kill is itself killed at the next moment,
# counted in its own process from where it resumed, and the chain's last run ends; each kill costs one run of the
# script instead of two (CI's time: 19 kills, 38 runs, took 9 minutes of a Zen 3). A link is (the moment, its
# occurrence in the run killed, its occurrence in an uninterrupted run, the complete checkpoints the kill leaves).
SET_UP_CHAIN = [  # in a fresh data cache
    ("corpus", 1, 1, []),
    ("bpe", 1, 1, []),
    ("tokenize", 1, 1, []),
    ("plan", 1, 1, []),
    ("update", 1, 1, []),
]
TRAINING_CHAIN = [
    ("checkpoint-weights", 1, 1, []),  # checkpoint-10, cut off
    ("checkpoint-marker", 1, 1, []),  # checkpoint-10, whole but unmarked
    ("update", 15, 15, [10]),
    ("validation", 1, 1, [10]),  # at 20, from checkpoint-10
    ("checkpoint-optimizer", 1, 2, [10]),  # checkpoint-20
    ("checkpoint-weights", 2, 3, [10, 20]),  # checkpoint-30, from checkpoint-10
    ("update", 13, 33, [10, 20, 30]),  # from checkpoint-20
    ("checkpoint-optimizer", 1, 4, [10, 20, 30]),  # checkpoint-40, from checkpoint-30
    ("checkpoint-marker", 1, 4, [10, 20, 30]),
    ("validation", 1, 2, [10, 20, 30]),  # at 40
]
FINISHING_CHAIN = [
    ("averaging", 1, 1, [10, 20, 30, 40]),
    ("model-folder", 1, 1, [10, 20, 30, 40]),
    ("card", 1, 1, [10, 20, 30, 40]),
    ("plots", 1, 1, [10, 20, 30, 40]),
]
CHAINS = {"set-up": SET_UP_CHAIN, "training": TRAINING_CHAIN, "finishing": FINISHING_CHAIN}


def resumed_from(stderr: str) -> str:
    """The checkpoint a run said it resumed from ("start" where it said none)."""
    said = next((line for line in stderr.splitlines() if "resuming from" in line), "")
    return said.rsplit("/", 1)[-1] or "start"


def newest(complete: list[Path]) -> str:
    """The checkpoint a run must resume from, of the complete ones: the newest ("start" where there is none)."""
    return complete[-1].name if complete else "start"


@pytest.mark.slow
@pytest.mark.parametrize("chain", list(CHAINS))
def test_a_run_killed_at_any_moment_resumes_to_the_uninterrupted_runs_weights(reference, tmp_path, chain):
    folder, reference_cache = reference
    cache = tmp_path / "cache" if chain == "set-up" else reference_cache
    arguments = command(tmp_path / "run", cache)
    complete: list[Path] = []  # the complete checkpoints before each run
    for moment, count, occurrence, left in CHAINS[chain]:
        killed = run(arguments, HF_VANILLA_TRANSFORMER_KILL_AT=f"{moment}:{count}")
        assert killed.returncode == -signal.SIGKILL, (moment, occurrence, killed.returncode, killed.stderr[-2000:])
        assert not (tmp_path / "run" / "results.json").exists()
        # It had resumed from the newest complete checkpoint the kill before left, no older.
        assert resumed_from(killed.stderr) == newest(complete), (moment, occurrence)
        complete = checkpoint_folders(tmp_path / "run")
        assert [int(path.name.split("-")[1]) for path in complete] == left, (moment, occurrence, complete)
        record("kill", moment=moment, count=occurrence, where=MOMENTS[moment], resumed=newest(complete))
    again = run(arguments)
    assert again.returncode == 0, again.stderr[-3000:]
    assert resumed_from(again.stderr) == newest(complete)
    assert_complete_and_equal(tmp_path / "run", folder)


@pytest.mark.slow
def test_a_kill_before_the_marker_keeps_the_checkpoint_before_under_save_total_limit(reference, tmp_path):
    """`--save_total_limit 1`: the older checkpoint goes only once the newer is complete."""
    arguments = command(tmp_path / "run", reference[1], "--save_total_limit", "1")
    killed = run(arguments, HF_VANILLA_TRANSFORMER_KILL_AT="checkpoint-marker:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert [path.name for path in checkpoint_folders(tmp_path / "run")] == ["checkpoint-10"]
    again = run(arguments)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from " in again.stderr and again.stderr.split("resuming from ")[1].split()[0].endswith("-10")
    assert [path.name for path in checkpoint_folders(tmp_path / "run")] == ["checkpoint-40"]


@pytest.mark.slow
def test_a_budgeted_run_killed_while_re_planning_resumes_with_the_plan_its_checkpoint_holds(tmp_path):
    arguments = [
        sys.executable,
        str(ROOT / "scripts" / "train.py"),
        *("--recipe", "cpu", "--preset", "tiny", "--max_minutes", "1", "--output_dir", str(tmp_path / "run")),
        *("--data_files", str(TRAIN), "--validation_files", str(HELD_OUT), "--test_files", str(HELD_OUT)),
        *("--max_eval_samples", "10", "--disable_tqdm", "true", "--source_check", "warn"),
        *("--data_cache_dir", str(tmp_path / "cache")),
    ]
    killed = run(arguments, HF_VANILLA_TRANSFORMER_KILL_AT="replan:1")  # the first check's re-plan (always written)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    planned = json.loads((tmp_path / "run" / "budget.json").read_text())
    again = run(arguments)
    assert again.returncode == 0, again.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    # The plan of the checkpoint it resumed from (or budget.json's, before the first checkpoint), never half a file;
    # trained to its length, or stopped where validation BLEU stopped rising or at the deadline (a slower machine).
    plan, steps = results["plan"], results["training"]["steps"]
    assert plan["max_steps"] > 0 and planned["max_steps"] > 0
    assert steps == plan["max_steps"] or plan["ended_by"] in ("validation plateau", "deadline"), (steps, plan)
    record("kill", moment="replan", count=1, where=MOMENTS["replan"], resumed="its checkpoint's plan")


# ---------------------------------------------------------------------------------------------------------------------
# A full device
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def small_device(tmp_path) -> Path:
    """A 64 MB file system of its own (tmpfs), where the test may mount one."""
    mount = tmp_path / "device"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.decode().strip() or 'not root'})")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def size_bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("moment", "where", "writing"),
    [
        ("checkpoint-weights:2", "output", "checkpoint checkpoint-20"),
        ("corpus", "cache", "the cached"),
        ("model-folder", "output", "the model folder"),
    ],
)
def test_a_full_device_is_named_in_one_line_and_the_run_resumes_once_space_is_freed(
    small_device, tmp_path, moment, where, writing
):
    output = (small_device if where == "output" else tmp_path) / "run"
    cache = (small_device if where == "cache" else tmp_path) / "cache"
    arguments = command(output, cache)
    full = run(arguments, HF_VANILLA_TRANSFORMER_FILL_AT=moment)
    assert full.returncode == 1, full.stderr[-3000:]
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: no space left on the device of ") and f"while writing {writing}" in last, last
    assert "run the same command again" in last
    free, needed = (
        size_bytes(part)
        for part in re.search(r"([\d.]+ [a-zA-Z]+) free, about ([\d.]+ [a-zA-Z]+) needed", last).groups()
    )
    assert free < needed, last  # what the device holds besides the run's own partial writes is not counted as free
    if where == "cache":  # no entry to be read as complete, nor a temporary one left
        assert not list((cache / "corpora").iterdir())
    if moment.startswith("checkpoint"):  # the partial checkpoint is gone; the one before it stays, loadable
        assert [path.name for path in checkpoint_folders(output, complete_only=False)] == ["checkpoint-10"]
    if where == "output":
        validate_checkpoint(checkpoint_folders(output)[-1])
    for filler in set(tmp_path.rglob(FILLER)):  # the user frees the space (the device is mounted in tmp_path)
        filler.unlink()
    again = run(arguments)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (output / "results.json").exists()
    record("full device", moment=moment, message=last.removeprefix("train.py: "))


# ---------------------------------------------------------------------------------------------------------------------
# Two runs, one folder; two jobs, one cache
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_run_into_a_folder_in_use_is_refused_and_a_killed_runs_lock_is_taken_over(tmp_path):
    arguments = command(tmp_path / "run", tmp_path / "cache", "--max_steps", "400", "--save_steps", "100")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_VANILLA_TRANSFORMER_ALLOCATOR": "system"}
    first = subprocess.Popen(
        arguments, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        lock = tmp_path / "run" / ".lock"
        deadline = time.monotonic() + 240
        while not (lock.exists() and lock.read_text().strip()):
            assert first.poll() is None and time.monotonic() < deadline, "the first run never took its lock"
            time.sleep(0.05)
        second = run(arguments)
        assert second.returncode == 1
        last = second.stderr.strip().splitlines()[-1]
        assert last.startswith(f"train.py: {tmp_path / 'run'} is in use by another run (process {first.pid} on ")
        while not checkpoint_folders(tmp_path / "run") and first.poll() is None:
            assert time.monotonic() < deadline + 240, "the first run saved no checkpoint"
            time.sleep(0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    assert str(first.pid) in lock.read_text()  # a killed run leaves its lock file behind ...
    third = run(command(tmp_path / "run", tmp_path / "cache", "--max_steps", "400", "--save_steps", "100"))
    assert third.returncode == 0, third.stderr[-3000:]  # ... which holds nothing: the next run takes it over
    assert "taken over" in third.stderr and lock.read_text() == ""
    record("two runs", message=last.removeprefix("train.py: "))


def test_a_lock_dies_with_the_process_that_took_it_not_with_its_last_child(tmp_path):
    """A run killed alone (the OOM killer picks one process) while its BPE child or a map worker still runs leaves
    its folder and its cache entry free: a forked child does not hold its parent's locks."""
    script = f"""
import os, sys, time
from pathlib import Path
from hf_vanilla_transformer.utils.locks import folder_lock, preparing
with folder_lock({str(tmp_path / "run")!r}), preparing(Path({str(tmp_path / "entry.lock")!r}), Path("entry")):
    child = os.fork()
    if child == 0:
        os.close(1), os.close(2)  # the test reads the parent's output to its end
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
    os.kill(os.getpid(), 9)
"""
    died = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    child = int(died.stdout.split()[0])
    try:
        os.kill(child, 0)  # the child still runs ...
        with folder_lock(tmp_path / "run"), (tmp_path / "entry.lock").open("a") as entry:
            fcntl.flock(entry, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ... and both locks are free
    finally:
        os.kill(child, signal.SIGKILL)


@pytest.mark.slow
def test_two_jobs_preparing_one_corpus_at_once_both_read_it_whole(reference, tmp_path):
    folder, _ = reference
    cache = tmp_path / "cache"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_VANILLA_TRANSFORMER_ALLOCATOR": "system"}
    logs = {name: (tmp_path / f"{name}.log").open("w") for name in ("one", "two")}
    jobs = [
        subprocess.Popen(command(tmp_path / name, cache), env=env, stdout=log, stderr=subprocess.STDOUT)
        for name, log in logs.items()
    ]
    for job, (name, log) in zip(jobs, logs.items(), strict=True):
        job.wait(timeout=600)
        log.close()
        assert job.returncode == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    for name in ("one", "two"):
        assert_complete_and_equal(tmp_path / name, folder)
    for kind in ("corpora", "tokenizers"):
        assert len([p for p in (cache / kind).iterdir() if ".tmp-" not in p.name]) == 1, kind
    assert not list(cache.rglob("*.tmp-*"))  # no temporary folder left behind
    # Each entry prepared by one job only: the other waited for its lock (or came after), then read it.
    logs = [(tmp_path / f"{name}.log").read_text() for name in ("one", "two")]
    for said in ("learning a shared BPE", "training pairs into"):
        assert sum(log.count(said) for log in logs) == 1, said
    waited = sum(log.count("waiting for process") for log in logs)
    record("two jobs", message=f"both ended with the reference weights; each entry prepared once ({waited} waits)")


def test_a_job_that_wants_an_entry_another_prepares_waits_for_it_and_reads_it(tmp_path, caplog):
    """The entry's lock held (as by another job preparing it): a second reader waits, naming the holder, and once
    the entry is published reads it instead of preparing its own."""
    first = parallel_files_corpus(str(TRAIN), cache_dir=tmp_path / "cache")
    folder = Path(first["train"].cache_files[0]["filename"]).parent
    shutil.rmtree(folder)
    done = threading.Event()
    found = {}

    def second():
        found["corpus"] = parallel_files_corpus(str(TRAIN), cache_dir=tmp_path / "cache")
        done.set()

    with caplog.at_level(logging.INFO), entry_lock(folder, tmp_path / "cache"):
        thread = threading.Thread(target=second)
        thread.start()
        assert not done.wait(1.0)  # held: it waits
        with building(folder) as temporary:  # "the other job" publishes the entry
            write_pairs([("only", "this")], temporary / "train.arrow")
            (temporary / SKIPPED_FILE).write_text("{}\n")
    thread.join(timeout=60)
    assert done.is_set() and found["corpus"]["train"]["source"] == ["only"]  # read, not prepared again
    assert any(f"waiting for process {os.getpid()} on " in message for message in caplog.messages)


# ---------------------------------------------------------------------------------------------------------------------
# Damaged caches
# ---------------------------------------------------------------------------------------------------------------------


def test_a_cache_copied_elsewhere_keeps_its_keys(tmp_path):
    """Tokenizers and tokenizations are keyed by the corpus they came from: a cache copied or mounted elsewhere (times
    kept) finds them under the same keys, so damage to them is found, and nothing is prepared again."""
    parallel_files_corpus(str(TRAIN), cache_dir=tmp_path / "here")
    shutil.copytree(tmp_path / "here", tmp_path / "there")
    here, there = (parallel_files_corpus(str(TRAIN), cache_dir=tmp_path / name)["train"] for name in ("here", "there"))
    assert there.cache_files[0]["filename"].startswith(str(tmp_path / "there"))
    assert dataset_key(here) == dataset_key(there)
    assert dataset_key(here.select(range(50))) == dataset_key(there.select(range(50)))
    assert dataset_key(here.select(range(50))) != dataset_key(here.select(range(1, 51)))


def test_an_entry_is_read_whole_again_only_once_written_since_its_last_check(tmp_path, monkeypatch):
    """An entry's files are checked against their CRC-32s when their signature (size, times of modification and of
    change, inode) differs from the one of their last check: an unchanged entry is not read again (a warm run on 13
    GB); a byte changed in place, its modification time set back, is still found (its time of change moved). A
    local file's hash is kept the same way: a file changed in place gets a new key."""
    from hf_vanilla_transformer.data import cache

    folder = tmp_path / "cache" / "tokenized" / "entry"
    with building(folder) as temporary:
        (temporary / "train.arrow").write_bytes(bytes(range(256)) * 64)
    read = []
    original = cache.file_crc
    monkeypatch.setattr(cache, "file_crc", lambda path: read.append(path.name) or original(path))
    monkeypatch.setattr(cache, "RACY_NS", 0)  # (a file changed within 2 s of a check is checked again)
    time.sleep(0.05)  # past the file system's clock tick
    assert cache.complete_folder(folder) == folder and read == []  # checked as it was published
    (folder / cache.CHECKED).unlink()  # (a cache written before these records, or copied elsewhere)
    assert cache.complete_folder(folder) == folder and read == ["train.arrow"]
    assert cache.complete_folder(folder) == folder and read == ["train.arrow"]  # not again
    path, before = folder / "train.arrow", (folder / "train.arrow").stat()
    with path.open("r+b") as handle:
        handle.seek(1000)
        handle.write(b"\xff")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert cache.complete_folder(folder) is None and not folder.exists()  # found, set aside, to be built again
    (tmp_path / "pairs.tsv").write_text("a\tb\n", encoding="utf-8")
    time.sleep(0.05)
    first = cache.files_key([tmp_path / "pairs.tsv"], "settings", cache_dir=tmp_path / "cache")
    assert cache.files_key([tmp_path / "pairs.tsv"], "settings", cache_dir=tmp_path / "cache") == first
    assert len(list((tmp_path / "cache" / cache.KEYS).glob("*.json"))) == 1  # its hash kept with its signature
    stat = (tmp_path / "pairs.tsv").stat()
    time.sleep(0.05)
    (tmp_path / "pairs.tsv").write_text("a\tc\n", encoding="utf-8")
    os.utime(tmp_path / "pairs.tsv", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cache.files_key([tmp_path / "pairs.tsv"], "settings", cache_dir=tmp_path / "cache") != first


def test_only_a_full_device_is_taken_for_one(tmp_path):
    full = OSError(errno.ENOSPC, "No space left on device")
    wrapped = RuntimeError("the checkpoint could not be written")
    wrapped.__cause__ = full
    assert is_disk_full(full) and is_disk_full(wrapped) and is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    # torch.save names no cause: a failed write counts only where the device is nearly full, which tmp_path is not
    assert not is_disk_full(
        RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0"), tmp_path
    )
    assert not is_disk_full(ValueError("a bug in the plots"), tmp_path)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) * 2 // 3] ^= 0x40
    path.write_bytes(bytes(data))


DAMAGES = {
    "a truncated corpus file": ("corpora", "train.arrow", truncate),
    "a flipped byte in a tokenization": ("tokenized", "train.arrow", flip),
    "a missing file of a tokenization": ("tokenized", "train.arrow", Path.unlink),
    "a tokenizer JSON cut short": ("tokenizers", "tokenizer.json", truncate),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_cache_is_found_on_open_and_built_again(reference, tmp_path, damage):
    folder, reference_cache = reference
    cache = tmp_path / "cache"
    shutil.copytree(reference_cache, cache)
    kind, name, hurt = DAMAGES[damage]
    hurt(next((cache / kind).rglob(name)))
    result = run(command(tmp_path / "run", cache))
    assert result.returncode == 0, result.stderr[-3000:]
    said = next(line for line in result.stderr.splitlines() if "is damaged" in line)
    assert name in said and "built again" in said
    assert_complete_and_equal(tmp_path / "run", folder)
    record("damaged cache", damage=damage, message=said.split("WARNING", 1)[-1].split(": ", 1)[-1])


@pytest.mark.slow
def test_a_damaged_tokenizer_in_the_output_folder_is_made_again_on_resume(reference, tmp_path):
    folder, cache = reference
    arguments = command(tmp_path / "run", cache)
    killed = run(arguments, HF_VANILLA_TRANSFORMER_KILL_AT="update:25")
    assert killed.returncode == -signal.SIGKILL
    truncate(tmp_path / "run" / "tokenizer" / "tokenizer.json")
    again = run(arguments)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "cannot be read" in again.stderr and "the tokenizer is made again" in again.stderr
    assert_complete_and_equal(tmp_path / "run", folder)
    record("damaged cache", damage="the run's own tokenizer cut short", message="made again from the cache")


# ---------------------------------------------------------------------------------------------------------------------
# Bad data and bad flags
# ---------------------------------------------------------------------------------------------------------------------


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


GOOD = b"Open a file.\tOeffnen Sie eine Datei.\nSave it.\tSpeichern Sie sie.\n"


def test_lines_that_are_no_pair_are_left_out_and_counted(tmp_path):
    crlf = write(tmp_path / "crlf.tsv", b"End.\tEnde.\r\nGo.\tLos.\r\n")  # CRLF line ends
    corpus = parallel_files_corpus(crlf, cache_dir=tmp_path / "cache")
    assert corpus["train"]["target"] == ["Ende.", "Los."]  # no carriage return left
    empty_sides = b"\tnothing\n" + b"nothing\t\n"
    nul = b"a\x00b\tc\n"
    megabyte = b"x" * 1_000_000 + b"\tlong\n"
    dirty = write(tmp_path / "dirty.tsv", GOOD + empty_sides + nul + megabyte)
    corpus = parallel_files_corpus(dirty, cache_dir=tmp_path / "cache")
    assert len(corpus["train"]) == 2
    assert corpus.skipped_lines["train"]["lines"] == {SKIPPED["empty"]: 2, SKIPPED["nul"]: 1, SKIPPED["long"]: 1}
    again = parallel_files_corpus(dirty, cache_dir=tmp_path / "cache")  # from the cache: the same counts
    assert again.skipped_lines == corpus.skipped_lines
    for reason, lines in corpus.skipped_lines["train"]["lines"].items():
        record("bad data", input=f"a TSV line with {reason}", message=f"left out and counted ({lines} here)")
    record("bad data", input="a TSV with CRLF line ends", message="read: no carriage return left in the text")


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("latin1.tsv", GOOD + "Größe\tsize\n".encode("latin-1"), r"latin1.tsv:3 is not UTF-8 text \(byte 0xf6"),
        ("tabless.tsv", GOOD + b"Close it.\n", r"tabless.tsv:3 has 1 tab-separated fields; a TSV needs exactly 2"),
        (
            "fields.jsonl",
            b'{"source": "a", "target": "b"}\n{"src": "a", "tgt": "b"}\n',
            r"fields.jsonl:2 has no string",
        ),
    ],
)
def test_a_file_that_breaks_its_format_is_refused_naming_the_file_and_the_line(tmp_path, name, data, message):
    with pytest.raises(ValueError, match=message) as refused:
        parallel_files_corpus(write(tmp_path / name, data), cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.arrow"))  # nothing cached
    record("bad data", input=name, message=f"refused: {str(refused.value).replace(str(tmp_path) + '/', '')}")


@pytest.mark.slow  # a script in a process of its own: about 11 s on a Zen 3
def test_a_data_file_that_breaks_its_format_stops_train_py_in_one_line_before_training(tmp_path):
    bad = write(tmp_path / "latin1.tsv", GOOD + "Größe\tsize\n".encode("latin-1"))
    arguments = [sys.executable, str(ROOT / "scripts" / "train.py"), "--preset", "tiny", "--data_files", str(bad)]
    result = run([*arguments, "--output_dir", str(tmp_path / "run"), "--data_cache_dir", str(tmp_path / "cache")])
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"train.py: {bad}:3 is not UTF-8 text (byte 0xf6"), last
    assert not (tmp_path / "run" / "budget.json").exists()  # refused before any plan or update
    record("bad data", input="latin1.tsv through train.py", message=f"`{last.replace(str(tmp_path) + '/', '')}`")


@pytest.mark.slow
def test_the_skipped_lines_reach_the_log_and_results_json(tmp_path):
    dirty = tmp_path / "dirty.tsv"
    dirty.write_bytes(TRAIN.read_bytes() + b"\tno source\nno target\t\nNUL\x00\tbyte\n")
    arguments = command(tmp_path / "run", tmp_path / "cache", "--max_steps", "4", "--save_steps", "4")
    arguments[arguments.index(str(TRAIN))] = str(dirty)
    result = run(arguments)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{dirty}: left out 2 lines with an empty source or target, 1 line with a NUL byte" in result.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["data"]["skipped_lines"]["train"]["lines"] == {SKIPPED["empty"]: 2, SKIPPED["nul"]: 1}


@pytest.mark.slow  # a script in a process of its own: about 11 s on a Zen 3
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--preset", "giant"],
            "train.py: preset='giant' is invalid; expected one of ['base', 'big', 'compact', 'medium', 'small', 'tiny'].",
        ),
        (
            ["--max_minutes", "0.01", "--recipe", "cpu"],
            "train.py: max_minutes=0.01 leaves no time to train:",
        ),
    ],
)
def test_a_bad_flag_or_a_budget_the_set_up_spends_is_one_line(tmp_path, flags, message):
    arguments = [
        sys.executable,
        str(ROOT / "scripts" / "train.py"),
        *("--output_dir", str(tmp_path / "run"), "--data_files", str(TRAIN), "--data_cache_dir", str(tmp_path)),
        *flags,
    ]
    result = run(arguments)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    record("bad flag", input=" ".join(flags), message=result.stderr.strip().splitlines()[-1])


def table(report: str) -> str:
    """The Markdown table of docs/reliability.md, from a report the suite wrote."""
    rows = ["| fault | where it struck | what the run did |", "|---|---|---|"]
    for line in Path(report).read_text(encoding="utf-8").splitlines():
        # The test's own temporary folder, left out: "…/run", "…/cache/corpora/<key>".
        found = json.loads(re.sub(r"/tmp/pytest-of-[^/]+/pytest-\d+/[^/]+/", "…/", line))
        kind = found.pop("kind")
        if kind == "kill":
            count = found["count"]
            suffix = "th" if 10 <= count % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(count % 10, "th")
            occurrence = f" (the {count}{suffix} time)" if count > 1 else ""
            resumed = "from the start" if found["resumed"] == "start" else f"from {found['resumed']}"
            rows.append(
                f"| SIGKILL at `{found['moment']}`{occurrence} | {found['where']} | run again: resumed {resumed}, "
                "ended with the uninterrupted run's weights, bit for bit |"
            )
        elif kind == "full device":
            rows.append(
                f"| full device at `{found['moment']}` | a 64 MB tmpfs | stopped: `{found['message']}`; "
                "run again once space was freed: completed |"
            )
        elif kind == "damaged cache":
            rows.append(
                f"| {found['damage']} | the data cache | `{found['message']}`; ended with the reference weights |"
            )
        elif kind == "bad data":
            rows.append(f"| {found['input']} | reading a training file | {found['message']} |")
        elif kind == "bad flag":
            rows.append(f"| `train.py {found['input']}` | the command line | `{found['message']}` |")
        else:
            where = "one output folder" if kind == "two runs" else "one data cache"
            rows.append(f"| {kind} at once | {where} | {found['message']} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(sys.argv[1]))
