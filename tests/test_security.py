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

import pytest

from conftest import ROOT


PACKAGE = ROOT / "hf_vanilla_transformer"


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
