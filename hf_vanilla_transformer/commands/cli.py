"""`vanilla-transformer <command> [flags]`: the one command the package installs (`[project.scripts]`), like
`accelerate launch` or `fairseq-train`, dispatching to the command modules of this folder. `vanilla-transformer
--help` lists them; `vanilla-transformer <command> --help` shows a command's flags."""

from __future__ import annotations

import importlib
import sys

from ..utils.allocator import use_fast_allocator


# command -> (module, function, what it does); training commands re-run with a faster allocator (utils/allocator.py)
COMMANDS = {
    "train": ("train", "main", "train, average, evaluate and save a model folder, from a recipe and flags"),
    "main": ("train", "main_job", "the main job: this machine's recipe (gpu or cpu) on the LibreOffice EN-DE corpora"),
    "translate": ("translate", "main", "translate a file or standard input with a model folder or an export"),
    "score": ("score", "main", "sacreBLEU and chrF of a model folder on a test split or your files"),
    "export": ("export", "main", "export a model folder to CTranslate2 or ONNX"),
    "convert": ("convert", "main", "a MarianMTModel or FSMT folder or a fairseq checkpoint into a model folder"),
    "average": ("average", "main", "average the last checkpoints of a run into a model folder"),
    "push": ("push", "main", "publish a model folder to the Hugging Face Hub"),
    "plot-attention": ("plot_attention", "main", "draw the attention maps of a sentence"),
    "benchmark": ("benchmark", "main", "speed and memory against MarianMTModel, side by side"),
    "deploy-benchmark": ("deploy_benchmark", "main", "every export engine on a trained model folder"),
    "scale-benchmark": ("scale_benchmark", "main", "a WMT-sized corpus from a raw TSV to the first update"),
    "finetune-benchmark": (
        "finetune_benchmark",
        "main",
        "a model adapted in a fixed budget, beside its start and scratch",
    ),
    "curve": ("curve", "main", "the recipe at a list of budgets, one run each: a table and a plot of BLEU by minutes"),
    "gpu-check": ("gpu_check", "main", "the gpu tests, a main job and the benchmark, as one table (9.5 minutes)"),
    "configs": ("configs", "main", "the recipes and accelerate files shipped with the package, with their paths"),
}
TRAINING = ("train", "main")
NAME = "vanilla-transformer"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {NAME} <command> [flags]   ({NAME} <command> --help for a command's flags)", "", "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, _, what) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int | None:
    """Run the command `argv[0]` with the flags after it (default: this process's command line)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, flags = argv[0], argv[1:]
    if name not in COMMANDS:
        raise SystemExit(f"{NAME}: {name!r} is not a command; expected one of {', '.join(COMMANDS)}.")
    if name in TRAINING:
        use_fast_allocator()  # re-runs this very command line once, with mimalloc preloaded
    module, function, _ = COMMANDS[name]
    command = getattr(importlib.import_module(f"{__package__}.{module}"), function)
    return command(flags, prog=f"{NAME} {name}")
