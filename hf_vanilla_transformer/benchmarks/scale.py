"""Scale benchmark: a WMT-sized corpus through the data pipeline, from a raw TSV to the first update.

For each corpus size N it writes (once, kept in `work_dir`) a TSV of N pairs made from the offline LibreOffice help
corpus, then runs the real `vanilla-transformer train` on it for `max_steps` updates, three ways:

* **cold**: one process, an empty data cache: read the TSV into Arrow, learn the BPE on its capped sample, tokenize in
  parallel, lengths and batches, build, plan, first update;
* **warm**: the same run again on the same data (a second run, or a resume): everything read from the cache;
* **launch** (largest N): `accelerate launch` with 2 processes (the same preset and vocabulary, or `launch_recipe`),
  an empty cache: the machine's first process prepares the data, the other reads it; then one process alone on the
  launch's data cache, to set the launch against.

Each process of each run records its set-up stages (seconds and peak RSS after each, the tokenizing workers' peak
apart) in `setup-rank<N>.json` (`utils/stages.py`); the benchmark gathers them. Then the batch sampler alone is timed
on `batch_pairs` lengths drawn like the corpus's. Nothing else may run on the machine meanwhile.

The synthetic corpus: the help's training pairs, each line either one pair or two pairs joined (a seeded choice, so
sentences average about WMT's length and nearly every line is new); held-out files of `held_out_pairs` pairs come
from the help's test split.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..configs import config_files
from ..utils.files import create_temporary_file
from ..utils.machine import describe_machine, memory_now, peak_rss_bytes, reset_peak_rss
from .measure import versions


@dataclass
class ScaleBenchmarkConfig:
    """What to measure; every field is a flag of `vanilla-transformer scale-benchmark`."""

    pairs: list[int] = field(default_factory=lambda: [1_000_000, 4_500_000])
    work_dir: str = "runs/scale"
    preset: str = "compact"
    vocab_size: int = 8000
    max_steps: int = 3
    launch: bool = True  # the 2-process launch on the largest corpus, then one process on its cache
    launch_recipe: str | None = None  # the launch's recipe ("base"); None: the preset and vocabulary of the others
    batch_pairs: int = 36_000_000
    held_out_pairs: int = 200
    held_out_files: bool = True  # false: the training file alone, its validation and test pairs carved out of it
    seed: int = 0


def synthesize_corpus(pairs: int, folder: Path, seed: int = 0, held_out: int = 200) -> dict[str, Path]:
    """{"train", "validation", "test"}: TSV files of `pairs` training pairs and `held_out` held-out pairs each, made
    from the LibreOffice help (see the module docstring); written once, kept."""
    from ..data.corpora import load_corpus

    folder.mkdir(parents=True, exist_ok=True)
    files = {
        name: folder / f"{name}-{pairs}.tsv" if name == "train" else folder / f"{name}.tsv"
        for name in ("train", "validation", "test")
    }
    if all(path.exists() for path in files.values()):
        return files
    corpus = load_corpus("libreoffice-help")
    sources, targets = list(corpus["train"]["source"]), list(corpus["train"]["target"])
    rng = np.random.default_rng(seed)
    first, second = rng.integers(0, len(sources), pairs), rng.integers(0, len(sources), pairs)
    joined = rng.random(pairs) < 0.5
    temporary, descriptor = create_temporary_file(files["train"])  # a new file, never through a link
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        for a, b, join in zip(first.tolist(), second.tolist(), joined.tolist(), strict=True):
            source = f"{sources[a]} {sources[b]}" if join else sources[a]
            target = f"{targets[a]} {targets[b]}" if join else targets[a]
            out.write(f"{source.replace(chr(9), ' ')}\t{target.replace(chr(9), ' ')}\n")
    temporary.replace(files["train"])
    test = corpus["test"]
    for name, rows in (("validation", range(held_out)), ("test", range(held_out, 2 * held_out))):
        lines = [f"{test[i]['source'].replace(chr(9), ' ')}\t{test[i]['target'].replace(chr(9), ' ')}\n" for i in rows]
        files[name].write_text("".join(lines), encoding="utf-8")
    return files


def train_command(
    files: dict, output: Path, cache: Path, options: ScaleBenchmarkConfig, recipe: str | None = None
) -> list:
    """`vanilla-transformer train` (as `-m hf_vanilla_transformer train`) on the synthetic files for `max_steps`
    updates, nothing but what reaches the first update; with `recipe`, that recipe's model and data settings."""
    model = ["--recipe", recipe] if recipe else ["--preset", options.preset, "--vocab_size", str(options.vocab_size)]
    held_out = ("--validation_files", str(files["validation"]), "--test_files", str(files["test"]))
    return [
        *("-m", "hf_vanilla_transformer", "train"),
        *model,
        *("--data_files", str(files["train"]), *(held_out if options.held_out_files else ())),
        *("--data_cache_dir", str(cache), "--output_dir", str(output)),
        *("--max_steps", str(options.max_steps), "--save_steps", str(options.max_steps), "--eval_strategy", "no"),
        *("--test_beams", "1", "--use_cpu", "true", "--disable_tqdm", "true"),
        *("--average_last", "1", "--logging_steps", "1"),
    ]


def run_training(command: list, output: Path, processes: int = 1) -> dict:
    """Run one training (under `accelerate launch` for several processes) and gather every process's set-up."""
    if output.exists():
        shutil.rmtree(output)
    output.mkdir(parents=True)
    launcher = [sys.executable]
    if processes > 1:
        launcher = [
            *(sys.executable, "-m", "accelerate.commands.launch"),
            *("--config_file", str(config_files("accelerate")["single_node_multi_gpu"])),
            *("--num_processes", str(processes), "--mixed_precision", "no", "--dynamo_backend", "no"),
        ]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
    began = time.time()
    with (output / "log.txt").open("w") as log:
        result = subprocess.run([*launcher, *command], stdout=log, stderr=subprocess.STDOUT, env=environment)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} ... failed; see {output / 'log.txt'}")
    setups = [json.loads(path.read_text()) for path in sorted(output.glob("setup-rank*.json"))]
    return {"wall_seconds": time.time() - began, "processes": setups}


def time_batches(pairs: int, lengths_like: tuple[np.ndarray, np.ndarray] | None, seed: int = 0) -> dict:
    """The batch sampler on `pairs` lengths (drawn from `lengths_like`, a corpus's own, or uniform): build it, then
    serve a whole epoch."""
    from ..data.batching import TokenBudgetBatchSampler

    rng = np.random.default_rng(seed)
    if lengths_like is not None:
        picks = rng.integers(0, len(lengths_like[0]), pairs)
        sources, targets = lengths_like[0][picks], lengths_like[1][picks]
    else:
        sources = rng.integers(2, 120, pairs)
        targets = np.clip(sources + rng.integers(-10, 15, pairs), 2, 256)
    before = memory_now()
    own = before.get("anon_rss_bytes", 0)
    resident = own + before.get("file_rss_bytes", 0)
    reset_peak_rss()
    began = time.perf_counter()
    sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=4096, seed=seed)
    built = time.perf_counter() - began
    build_peak = peak_rss_bytes() - resident  # what building held for a moment, on top of the lengths
    began = time.perf_counter()
    batches = iter(sampler)
    next(batches)
    first = time.perf_counter() - began
    count = 1 + sum(1 for _ in batches)
    held = memory_now().get("anon_rss_bytes", 0) - own  # the sampler's arrays and the epoch's order, if readable
    return {
        "sampler_bytes": held,
        "build_peak_bytes": build_peak,
        "pairs": pairs,
        "batches": count,
        "build_seconds": built,
        "first_batch_seconds": first,
        "epoch_seconds": first + time.perf_counter() - began,
    }


def corpus_lengths(cache: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The source and target lengths of the tokenized training split in a data cache, if there is one."""
    from datasets import Dataset, concatenate_datasets

    from ..data.pipeline import lengths

    shards = sorted(cache.glob("tokenized/*/*/train*.arrow"))
    return lengths(concatenate_datasets([Dataset.from_file(str(path)) for path in shards])) if shards else None


def run_scale_benchmark(options: ScaleBenchmarkConfig) -> dict:
    work = Path(options.work_dir)
    results = {"options": asdict(options), "machine": describe_machine("cpu"), "versions": versions(), "corpora": {}}
    for pairs in options.pairs:
        files = synthesize_corpus(pairs, work / "corpora", options.seed, options.held_out_pairs)
        cache = work / f"cache-{pairs}"
        shutil.rmtree(cache, ignore_errors=True)
        runs = {"tsv_bytes": files["train"].stat().st_size}
        print(f"{pairs:,} pairs: cold run", flush=True)
        runs["cold"] = run_training(train_command(files, work / "out", cache, options), work / "out")
        print(f"{pairs:,} pairs: warm run", flush=True)
        runs["warm"] = run_training(train_command(files, work / "out", cache, options), work / "out")
        results["corpora"][str(pairs)] = runs
    largest = str(max(options.pairs))
    if options.launch:
        files = synthesize_corpus(int(largest), work / "corpora", options.seed, options.held_out_pairs)
        cache = work / "cache-launch"
        shutil.rmtree(cache, ignore_errors=True)
        what = f"the {options.launch_recipe} recipe" if options.launch_recipe else options.preset
        print(f"{int(largest):,} pairs: 2-process launch of {what}", flush=True)
        command = train_command(files, work / "out-launch", cache, options, options.launch_recipe)
        results["launch"] = run_training(command, work / "out-launch", processes=2)
        print(f"{int(largest):,} pairs: {what} in one process (the launch's data cache)", flush=True)
        command = train_command(files, work / "out-launch", cache, options, options.launch_recipe)
        results["launch_alone"] = run_training(command, work / "out-launch")
    print(f"batches of {options.batch_pairs:,} pairs", flush=True)
    results["batches"] = time_batches(options.batch_pairs, corpus_lengths(work / f"cache-{largest}"), options.seed)
    return results


# ---------------------------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------------------------

STAGES = ("corpus", "tokenizer", "tokenize", "model", "lengths and batches", "plan")


def _gb(value: float) -> str:
    return f"{value / 2**30:.2f}"


def _peak(setup: dict) -> float:
    """A process's peak RSS over its set-up, and its tokenizing workers' peak (the larger)."""
    stages = setup["stages"].values()
    return max(max(s.get("peak_rss_bytes", 0), s.get("children_peak_rss_bytes", 0)) for s in stages)


def scale_table(results: dict) -> str:
    """The figures as Markdown: one row per corpus and run, the stages' seconds, the first update, peak memory."""
    lines = [
        f"Machine: {results['machine']}; " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()),
        "",
        "| pairs | run | " + " | ".join(STAGES) + " | first update (from start) | peak RSS GB (process / workers) "
        "| at the first update: own / mapped files / PSS GB |",
        "|---|---|" + "---|" * len(STAGES) + "---|---|---|",
    ]
    for pairs, runs in results["corpora"].items():
        for name in ("cold", "warm"):
            (setup,) = runs[name]["processes"]
            lines.append(_row(f"{int(pairs):,}", name, setup))
    launch = results.get("launch", {}).get("processes", [])
    recipe = results["options"].get("launch_recipe", "base") or results["options"]["preset"]
    for setup in launch:
        lines.append(_row("largest", f"{recipe}, 2 processes, rank {setup['rank']}", setup))
    alone = results.get("launch_alone", {}).get("processes", [])
    for setup in alone:
        lines.append(_row("largest", f"{recipe}, 1 process (warm)", setup))
    measured = ("pss_bytes", "arrow_pss_bytes")  # Linux only (/proc)
    if launch and alone and all(key in s["stages"]["plan"] for s in (*launch, *alone) for key in measured):
        lines += ["", launch_memory(launch, alone[0])]
    batches = results["batches"]
    lines += [
        "",
        f"Batches of {batches['pairs']:,} pairs at 4,096 tokens: built in {batches['build_seconds']:.1f} s, the first "
        f"batch of an epoch after {batches['first_batch_seconds']:.1f} s more, the whole epoch "
        f"({batches['batches']:,} batches) in {batches['epoch_seconds']:.1f} s"
        + (f"; the sampler holds {_gb(batches['sampler_bytes'])} GB" if batches.get("sampler_bytes") else "")
        + (
            f", building it {_gb(batches['build_peak_bytes'])} GB for a moment"
            if batches.get("build_peak_bytes")
            else ""
        )
        + ".",
    ]
    return "\n".join(lines)


DATA_STAGES = ("corpus", "tokenizer", "tokenize", "lengths and batches")


def data_memory(setups: list[dict]) -> tuple[list[int], int]:
    """What the processes of a run hold for the data at the end of their set-up: (each one's own memory added by
    the data's stages: its tables, tokenizer, length groups and batches; the Arrow files' resident pages, PSS summed
    over the processes: pages they share counted once)."""
    own = []
    for setup in setups:
        previous, added = setup["at_start"], 0
        for name, figures in setup["stages"].items():
            if name in DATA_STAGES:
                added += figures["anon_rss_bytes"] - previous["anon_rss_bytes"]
            previous = figures
        own.append(added)
    return own, sum(setup["stages"]["plan"]["arrow_pss_bytes"] for setup in setups)


def launch_memory(launch: list[dict], alone: dict) -> str:
    """The launch's memory at the end of set-up against one process of the same recipe: all of it, the Arrow
    pages, each process's own data memory."""
    together, one = (sum(setup["stages"]["plan"]["pss_bytes"] for setup in group) for group in (launch, [alone]))
    (own, pages), ((own_alone,), pages_alone) = data_memory(launch), data_memory([alone])
    return (
        f"At the end of their set-up the launch's {len(launch)} processes hold {_gb(together)} GB together (PSS "
        f"summed), {together / one:.2f}x the one process's {_gb(one)} GB. The Arrow files' pages: {_gb(pages)} GB "
        f"together, {pages / max(pages_alone, 1):.2f}x the one process's {_gb(pages_alone)} GB; each process's own memory "
        f"added by the data's stages: {' and '.join(_gb(value) for value in own)} GB, against {_gb(own_alone)} GB."
    )


def _row(pairs: str, name: str, setup: dict) -> str:
    stages = setup["stages"]
    cells = [f"{stages[s]['seconds']:.1f}" if s in stages else "" for s in STAGES]
    first = stages.get("first update", {}).get("since_start_seconds", float("nan"))
    workers = max(s.get("children_peak_rss_bytes", 0) for s in stages.values())
    own = max(s.get("peak_rss_bytes", 0) for s in stages.values())
    now = stages.get("first update", {})
    split = " / ".join(_gb(now[key]) if key in now else "" for key in ("anon_rss_bytes", "file_rss_bytes", "pss_bytes"))
    return f"| {pairs} | {name} | " + " | ".join(cells) + f" | {first:.0f} s | {_gb(own)} / {_gb(workers)} | {split} |"
