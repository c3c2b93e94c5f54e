"""One way to open an export: the engines `scripts/translate.py` and `scripts/score.py` translate with, their
command-line options, and the translator of a folder written by `scripts/export.py`."""

from __future__ import annotations

from pathlib import Path

import torch


ENGINES = ("torch", "ctranslate2", "onnx")


def add_engine_argument(parser) -> None:
    """The `--engine` and `--workers` options of the scripts that translate (translate.py, score.py)."""
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="torch",
        help="torch: this package's generate(); ctranslate2 or onnx (ONNX Runtime): a folder written by "
        "scripts/export.py --to ctranslate2 / onnx",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="ctranslate2: batches translated at once, sharing the threads (default: one per thread on a CPU)",
    )


def check_engine_arguments(parser, args) -> None:
    """End the script with a usage error (exit 2) where `--workers` comes with an engine that has none."""
    if args.workers is not None and args.engine != "ctranslate2":
        parser.error(f"--workers applies to --engine ctranslate2 only, not to {args.engine}")


def load_export(
    engine: str, folder: str | Path, device: str = "cpu", threads: int | None = None, workers: int | None = None
):
    """The translator of a folder written by `scripts/export.py`: a `CTranslate2Translator` or an `OnnxTranslator`,
    both with `translate(sentences, num_beams=...)`. `threads` None: as many as PyTorch uses. `workers` (CTranslate2
    only): batches translated at once; None: one per thread on a CPU. Without the engine's package, an ImportError
    says what to install."""
    if workers is not None and engine != "ctranslate2":
        raise ValueError(f"workers={workers!r} applies to the ctranslate2 engine only, not to {engine!r}.")
    if engine not in ENGINES[1:]:
        raise ValueError(f"engine={engine!r} has no export; expected 'ctranslate2' or 'onnx'.")
    threads = threads or torch.get_num_threads()
    try:
        if engine == "ctranslate2":
            from .ctranslate2 import CTranslate2Translator

            return CTranslate2Translator(folder, device=device, threads=threads, workers=workers)
        from .onnx_translator import OnnxTranslator

        return OnnxTranslator(folder, threads=threads)
    except ImportError as error:  # an optional dependency: said in one line, as the commands say every error
        raise ImportError(
            f"--engine {engine} needs the {error.name or engine} package: pip install 'hf_vanilla_transformer[deploy]'"
        ) from None
