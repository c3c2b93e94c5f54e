"""A model that exists, adapted to another domain in a fixed budget, side by side (`vanilla-transformer
finetune-benchmark`): on the test split of the adaptation corpus (default the LibreOffice UI strings),

1. the starting model as it is (`vanilla-transformer score`, its own decoding);
2. the same model fine-tuned for `minutes` on the corpus's training split with the `finetune` recipe, once per seed,
   and once per peak learning rate where a sweep is asked for (`--peaks`);
3. a model trained from scratch on the same split for the same minutes with this machine's recipe (cpu or gpu).

Each run is a process of its own, one after another (two training processes side by side oversubscribe the CPU),
into a folder of the benchmark's; the table (Markdown) and every figure (JSON) go there too. The steps' commands are
the package's own, so that every row is what a user gets from the same command line.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..training.recipes import machine_recipe
from ..utils.machine import describe_machine
from .gpu_check_steps import run_step


@dataclass(frozen=True)
class FinetuneBenchmark:
    """What to adapt, on what, for how long, and what to compare it with."""

    model_name_or_path: str
    output_dir: str
    minutes: float = 12.0
    data: tuple[str, ...] = ("--dataset", "libreoffice-ui")  # the training runs' data flags
    test: tuple[str, ...] = ("--dataset", "libreoffice-ui", "--split", "test")  # `score`'s: the same test split
    peaks: tuple[float | None, ...] = (None,)  # None: the finetune recipe's own peak
    seeds: tuple[int, ...] = (0,)
    scratch: bool = True  # the from-scratch row
    extra: tuple[str, ...] = field(default=())  # flags every training run gets (a smaller --max_eval_samples, ...)

    def __post_init__(self) -> None:
        if self.minutes <= 0:
            raise ValueError(f"minutes={self.minutes} is invalid; expected a number of minutes above 0.")
        if not self.seeds or any(peak is not None and peak <= 0 for peak in self.peaks):
            raise ValueError(f"seeds={self.seeds} and peaks={self.peaks}; expected a seed and positive peaks.")


def run_finetune_benchmark(options: FinetuneBenchmark) -> dict:
    """The three kinds of row of the module docstring; returns every figure (also in `figures.json`) and writes the
    table (`table.md`) into the output folder."""
    folder = Path(options.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    rows = [start_row(options, folder)]
    for peak in options.peaks:
        for seed in options.seeds:
            rows.append(training_row(options, folder, "finetune", seed, peak))
    if options.scratch:
        rows.append(training_row(options, folder, "scratch", options.seeds[0], None))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    figures = {"machine": describe_machine(device), "options": asdict(options), "rows": rows}
    (folder / "figures.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    table = render_table(rows, options)
    (folder / "table.md").write_text(table + "\n", encoding="utf-8")
    print(f"\n{table}", flush=True)
    return figures


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "hf_vanilla_transformer", *args]


def environment() -> dict:
    """The steps' environment: this one, unbuffered output, nothing from the Hub."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}


def start_row(options: FinetuneBenchmark, folder: Path) -> dict:
    """The starting model on the test split, decoded as its folder says (`score`'s JSON summary, its last lines)."""
    step = run_step(
        command("score", options.model_name_or_path, *options.test),
        folder / "start.log",
        3600,
        environment(),
    )
    row = {"row": "start", "command": step["command"], "status": step["status"]}
    if step["status"] == "ok":
        text = Path(step["log"]).read_text(encoding="utf-8")
        summary = json.loads(text[text.rindex("\n{") + 1 :] if "\n{" in text else text[text.index("{") :])
        row.update(bleu=summary["score"], chrf=summary["chrf"], pairs=summary["pairs"])
    return row


def training_row(options: FinetuneBenchmark, folder: Path, kind: str, seed: int, peak: float | None) -> dict:
    """A training run of `kind` ("finetune": from the starting model with its recipe; "scratch": this machine's
    recipe on the same data) for the benchmark's minutes, and its results.json's figures."""
    name = f"{kind}-seed{seed}" + (f"-peak{peak:g}" if peak is not None else "")
    flags = [*options.data, "--max_minutes", f"{options.minutes:g}", "--seed", str(seed)]
    flags += ["--output_dir", str(folder / name), "--disable_tqdm", "true", *options.extra]
    if kind == "finetune":
        flags = ["--model_name_or_path", options.model_name_or_path, *flags]
        flags += ["--peak_learning_rate", f"{peak:g}"] if peak is not None else []
    else:
        flags = ["--recipe", machine_recipe([]), *flags]
    step = run_step(command("train", *flags), folder / f"{name}.log", options.minutes * 60 + 600, environment())
    row = {"row": name, "kind": kind, "seed": seed, "peak": peak, "command": step["command"], "status": step["status"]}
    results_file = folder / name / "results.json"
    if results_file.exists():
        results = json.loads(results_file.read_text(encoding="utf-8"))
        plan, test = results["plan"], results["test"]
        row.update(bleu=test["bleu"], chrf=test["chrf"], pairs=test["pairs"], updates=results["training"]["steps"])
        row.update(peak_used=plan.get("peak_learning_rate"), warmup=plan.get("warmup_steps"))
        row.update(minutes=results["wall_seconds"] / 60, kept=(results.get("kept") or {}).get("kept"))
    return row


def render_table(rows: list[dict], options: FinetuneBenchmark) -> str:
    """The rows as Markdown: test BLEU and chrF, each against the start's, and how each was trained."""
    start = next((row for row in rows if row["row"] == "start" and "bleu" in row), None)
    lines = [
        f"test split of {' '.join(options.data)}, {options.minutes:g} minutes a run; start: {options.model_name_or_path}",
        "",
        "| run | test BLEU | chrF | BLEU against the start | updates | peak (warmup) | kept | minutes in all |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "bleu" not in row:
            lines.append(f"| {row['row']} | {row['status']} | | | | | | |")
            continue
        gain = f"{row['bleu'] - start['bleu']:+.2f}" if start and row is not start else ""
        peak = f"{row['peak_used']:.2e} ({row['warmup']:,})" if row.get("peak_used") else ""
        updates = f"{row['updates']:,}" if row.get("updates") else ""
        minutes = f"{row['minutes']:.1f}" if row.get("minutes") else ""
        lines.append(
            f"| {row['row']} | {row['bleu']:.2f} | {row['chrf']:.2f} | {gain} | {updates} | {peak} | "
            f"{row.get('kept') or ''} | {minutes} |"
        )
    return "\n".join(lines)
