"""The caching allocator is found and preloaded by re-executing the script once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from hf_vanilla_transformer.utils.allocator import mimalloc_library


SCRIPT = textwrap.dedent(
    """
    import os
    from hf_vanilla_transformer.utils.allocator import use_fast_allocator
    print("start", flush=True)
    use_fast_allocator()
    maps = open("/proc/self/maps").read()
    print("loaded" if "mimalloc" in maps else "not loaded", os.environ.get("MIMALLOC_PURGE_DELAY"))
    print("cache", os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"))
    """
)

# The script reads /proc/self/maps (Linux only), and where mimalloc is absent "not loaded" holds whatever is asked.
needs_mimalloc = pytest.mark.skipif(
    sys.platform != "linux" or mimalloc_library() is None, reason="needs Linux and cmeel-mimalloc"
)


def expected_cache() -> int | None:
    """The primitive cache `use_fast_allocator` asks for on this machine, for one process."""
    from hf_vanilla_transformer.utils.allocator import _total_memory_bytes, primitive_cache_capacity

    return primitive_cache_capacity(_total_memory_bytes(), 1)


@pytest.mark.slow  # two script processes started (about 8 s on a 2-core machine)
@needs_mimalloc
def test_scripts_rerun_once_with_mimalloc_preloaded():
    unset = ("LD_PRELOAD", "MIMALLOC_PURGE_DELAY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LOCAL_WORLD_SIZE")
    environment = {k: v for k, v in os.environ.items() if k not in unset}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environment, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines.count("start") == 2  # the first run, then the re-executed one
    assert "loaded -1" in lines
    assert f"cache {expected_cache()}" in lines  # set in the re-executed process's environment


@pytest.mark.slow  # a process of its own: 8-11 s on a Zen 3
@needs_mimalloc
def test_the_system_allocator_can_be_kept():
    environment = {**os.environ, "HF_VANILLA_TRANSFORMER_ALLOCATOR": "system"}
    for name in ("LD_PRELOAD", "ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LOCAL_WORLD_SIZE"):
        environment.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environment, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("start") == 1 and "not loaded" in result.stdout
    assert f"cache {expected_cache()}" in result.stdout.splitlines()  # the cache is not the allocator's setting


def test_the_primitive_cache_is_enlarged_only_with_the_memory_for_it_and_never_over_the_users_value(monkeypatch):
    from hf_vanilla_transformer.utils import allocator

    memory, large = allocator.CACHE_MEMORY_BYTES, allocator.LARGE_PRIMITIVE_CACHE
    assert allocator.primitive_cache_capacity(memory, 1) == large
    assert allocator.primitive_cache_capacity(memory - 1, 1) is None  # oneDNN's default
    assert allocator.primitive_cache_capacity(4 * memory, 4) == large
    assert allocator.primitive_cache_capacity(4 * memory, 5) is None  # each process needs its own
    for total, processes, mine, expected in [
        (memory, None, None, str(large)),
        (memory, "2", None, None),  # two processes of an accelerate launch on the machine
        (memory - 1, None, None, None),
        (4 * memory, None, "2048", "2048"),  # the user's value stays
        (4 * memory, None, "0", "0"),  # oneDNN's own way to turn the cache off, too
    ]:
        monkeypatch.setattr(allocator, "_total_memory_bytes", lambda total=total: total)
        monkeypatch.delenv("DNNL_PRIMITIVE_CACHE_CAPACITY", raising=False)
        for name in allocator.LOCAL_PROCESS_COUNTS[1:]:
            monkeypatch.delenv(name, raising=False)
        for name, value in (("LOCAL_WORLD_SIZE", processes), (allocator.PRIMITIVE_CACHE, mine)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        allocator.use_large_primitive_cache()
        assert os.environ.get(allocator.PRIMITIVE_CACHE) == expected, (total, processes, mine)
    monkeypatch.setattr(allocator, "_total_memory_bytes", lambda: 4 * memory)
    monkeypatch.delenv(allocator.PRIMITIVE_CACHE)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("DNNL_PRIMITIVE_CACHE_CAPACITY", "512")  # the older name: the user's too
    allocator.use_large_primitive_cache()
    assert allocator.PRIMITIVE_CACHE not in os.environ
    monkeypatch.delenv("DNNL_PRIMITIVE_CACHE_CAPACITY")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "5")  # an MPI launch of five processes on the machine
    allocator.use_large_primitive_cache()
    assert allocator.PRIMITIVE_CACHE not in os.environ
    monkeypatch.undo()
    assert allocator._total_memory_bytes() > 2**30  # this machine's (or container's) memory is read


def test_a_containers_memory_limit_counts_over_the_machines(tmp_path, monkeypatch):
    from hf_vanilla_transformer.utils import allocator

    limit = tmp_path / "memory.max"
    limit.write_text(f"{2**30}\n")
    monkeypatch.setattr(allocator, "CGROUP_LIMITS", (str(tmp_path / "absent"), str(limit)))
    assert allocator._total_memory_bytes() == 2**30
    limit.write_text("max\n")  # cgroup v2's "no limit"
    assert allocator._total_memory_bytes() > 2**30


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_mapped_file_counts_as_file_backed_memory_not_as_the_process_own(tmp_path):
    """What the scale benchmark reports: pages of a memory-mapped file that are read move the process's
    file-backed memory by what was read and leave its own (anonymous) memory where it was; `mapped_bytes` counts
    the pages of the files named `*.arrow` alone."""
    import mmap

    from hf_vanilla_transformer.utils.machine import mapped_bytes, memory_now

    path = tmp_path / "mapped.arrow"
    path.write_bytes(os.urandom(64 * 2**20))
    before, arrow_before = memory_now(), mapped_bytes()
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        total = sum(mapped[offset] for offset in range(0, 32 * 2**20, 4096))  # touch the first half's pages
        during, arrow = memory_now(), mapped_bytes()
        assert mapped_bytes(".bin") == {"arrow_rss_bytes": 0, "arrow_pss_bytes": 0}  # only files named so count
    assert total > 0
    assert during["file_rss_bytes"] - before["file_rss_bytes"] >= 30 * 2**20
    assert abs(during["anon_rss_bytes"] - before["anon_rss_bytes"]) < 16 * 2**20
    assert during["pss_bytes"] > before["pss_bytes"]
    # The file's own pages: the half that was read (and the pages the system maps around them), no more.
    assert arrow_before["arrow_rss_bytes"] == 0 and 32 * 2**20 <= arrow["arrow_rss_bytes"] <= 40 * 2**20
    assert 0 < arrow["arrow_pss_bytes"] <= arrow["arrow_rss_bytes"]
