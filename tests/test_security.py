"""What others hand the package runs nothing and what it publishes holds nothing private (issue 38, docs/security.md):
a checkpoint whose pickle would run code is refused by name; tokens and home paths stay out of results.json and the
card; translate and score run a folder's own code only when asked; locks and temporary files never follow a link;
a user's own test sentences stay home unless asked; the card's code escapes what it quotes; corpus lines and
translation inputs are read with a bound; the Debian download asks before apt-get update, keeps to its folder and
has caps; exports record no absolute path; the cache's temporary names are unique per machine; and a scan of the
package's source finds none of these mistakes again."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT


PACKAGE = ROOT / "hf_vanilla_transformer"


# ---------------------------------------------------------------------------------------------------------------------
# 1. A checkpoint whose pickle would run code is refused by name and runs nothing
# ---------------------------------------------------------------------------------------------------------------------


class RunsCode:
    """Pickled, it calls os.system on loading: the proof of concept of a checkpoint that runs code."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def checkpoint(folder: Path, rng_state) -> Path:
    """A checkpoint folder as the Trainer writes one (marker, config, state, weights, optimizer), with `rng_state`
    saved as its rng_state.pth."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / ".complete").write_text("10\n")
    (folder / "config.json").write_text("{}")
    (folder / "trainer_state.json").write_text('{"global_step": 10}')
    save_file({"weight": torch.ones(2, 2)}, folder / "model.safetensors")
    torch.save({"state": {0: {"exp_avg": torch.zeros(2)}}, "param_groups": [{"lr": 1e-3}]}, folder / "optimizer.pt")
    torch.save(rng_state, folder / "rng_state.pth")
    return folder


def test_a_checkpoint_whose_pickle_runs_code_is_refused_by_name_and_runs_nothing(tmp_path):
    from hf_vanilla_transformer.training.checkpoints import CheckpointError, validate_checkpoint

    marker = tmp_path / "ran"
    folder = checkpoint(tmp_path / "checkpoint-10", RunsCode(f"touch {marker}"))
    with pytest.raises(CheckpointError, match=r"checkpoint-10/rng_state\.pth holds objects other than tensors"):
        validate_checkpoint(folder)
    assert not marker.exists()


def test_a_checkpoint_with_the_trainers_rng_state_validates(tmp_path, trained_folder):
    """The Trainer's rng_state.pth holds numpy's generator state (arrays, dtypes): allowed, as the Trainer allows
    it on resuming (transformers' safe_globals); so are the checkpoints of a real run."""
    import random

    import numpy as np
    import torch

    from hf_vanilla_transformer.training.checkpoints import checkpoint_folders, validate_checkpoint

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    folder = checkpoint(tmp_path / "checkpoint-10", state)
    assert validate_checkpoint(folder) == folder
    written = checkpoint_folders(trained_folder[0])
    assert [path.name for path in written] == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
    for path in written:
        assert (path / "rng_state.pth").exists() and validate_checkpoint(path) == path


# ---------------------------------------------------------------------------------------------------------------------
# 4. Locks and temporary files never follow a symbolic link
# ---------------------------------------------------------------------------------------------------------------------


def test_a_run_lock_that_is_a_symbolic_link_is_refused_and_its_target_left_alone(tmp_path):
    from hf_vanilla_transformer.utils.locks import FolderInUseError, LockFileError, folder_lock

    victim = tmp_path / "notes.txt"
    victim.write_text("my notes\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").symlink_to(victim)
    with pytest.raises(LockFileError, match=r"run/\.lock is a symbolic link") as refused, folder_lock(tmp_path / "run"):
        pass
    assert isinstance(refused.value, FolderInUseError)  # every process of a launch stops with it, in one line
    assert victim.read_text() == "my notes\n"


def test_a_cache_entry_lock_that_is_a_link_or_a_second_name_is_refused(tmp_path):
    from hf_vanilla_transformer.utils.locks import LockFileError, preparing

    victim = tmp_path / "notes.txt"
    victim.write_text("my notes\n")
    locks = tmp_path / "cache" / ".locks"
    locks.mkdir(parents=True)
    (locks / "corpus.lock").symlink_to(victim)
    with (
        pytest.raises(LockFileError, match=r"corpus\.lock is a symbolic link"),
        preparing(locks / "corpus.lock", tmp_path / "cache" / "corpus"),
    ):
        pass
    os.link(victim, locks / "other.lock")  # a hard link: the same file under a second name
    with (
        pytest.raises(LockFileError, match=r"other\.lock is a file with 2 names"),
        preparing(locks / "other.lock", tmp_path / "cache" / "other"),
    ):
        pass
    assert victim.read_text() == "my notes\n"


def test_an_atomic_write_never_writes_through_a_link_at_a_temporary_name(tmp_path):
    from hf_vanilla_transformer.utils.files import write_text_atomically

    victim = tmp_path / "notes.txt"
    victim.write_text("my notes\n")
    (tmp_path / "results.json.tmp").symlink_to(victim)  # the fixed temporary name of earlier versions
    write_text_atomically(tmp_path / "results.json", "{}\n")
    assert victim.read_text() == "my notes\n"
    assert not (tmp_path / "results.json").is_symlink() and (tmp_path / "results.json").read_text() == "{}\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt", "results.json", "results.json.tmp"]


# ---------------------------------------------------------------------------------------------------------------------
# 10. The cache's temporary folders are unique per machine, not only per host name
# ---------------------------------------------------------------------------------------------------------------------


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_leftover_of_another_container_with_the_same_host_name_is_never_removed(tmp_path):
    from hf_vanilla_transformer.data.cache import process_space, temporary_folder

    host = socket.gethostname().replace("-", "_")
    where = process_space()
    assert where is not None and len(where) == 12  # Linux: /proc says
    pid = dead_pid()
    # the same host name and a pid not alive here: not provably ours
    theirs = tmp_path / f"corpus.tmp-{host}-{pid}-0a0a0a0a"
    theirs_too = tmp_path / f"corpus.tmp-{host}_0123456789ab-{pid}-0b0b0b0b"  # another kernel or container
    ours_dead = tmp_path / f"corpus.tmp-{host}_{where}-{pid}-0c0c0c0c"
    ours_alive = tmp_path / f"corpus.tmp-{host}_{where}-{os.getpid()}-0d0d0d0d"
    for folder in (theirs, theirs_too, ours_dead, ours_alive):
        folder.mkdir()
    fresh = temporary_folder(tmp_path / "corpus")
    assert fresh.name.startswith(f"corpus.tmp-{host}_{where}-{os.getpid()}-")
    assert theirs.is_dir() and theirs_too.is_dir() and ours_alive.is_dir()
    assert not ours_dead.exists()  # a dead process of this very machine: removed
