"""Export a trained model folder to CTranslate2 or ONNX (ONNX Runtime), for fast translation at volume.

Usage:
    vanilla-transformer export MODEL_DIR OUT_DIR --to ctranslate2 [--quantization int8] [--max_positions 1024]
    vanilla-transformer export MODEL_DIR OUT_DIR --to onnx [--quantization int8]
    vanilla-transformer translate OUT_DIR --engine ctranslate2|onnx < input.en > output.de

A CTranslate2 folder holds model.bin, the shared vocabulary, the tokenizer and a README saying how to translate with
it; an ONNX folder holds encoder.onnx, decoder_step.onnx, the tokenizer and a README. What maps where, and what
CTranslate2 decodes differently (its beam-search length penalty): `hf_vanilla_transformer/export.py`,
`hf_vanilla_transformer/export_onnx.py` and docs/deploy.md. A bad folder or value ends the script with one line.
"""

import sys
from pathlib import Path

from ..deploy.ctranslate2 import QUANTIZATIONS, export_ctranslate2
from ..deploy.onnx import ONNX_QUANTIZATIONS, export_onnx
from ..utils.command_line import CommandParser


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    parser = CommandParser(prog, __doc__)
    parser.add_argument(
        "model_dir", help="a model folder written by vanilla-transformer train or vanilla-transformer main"
    )
    parser.add_argument("output_dir", help="the folder to write")
    parser.add_argument("--to", choices=["ctranslate2", "onnx"], default="ctranslate2", help="the engine to export to")
    parser.add_argument(
        "--quantization",
        choices=sorted(set(QUANTIZATIONS) | set(ONNX_QUANTIZATIONS)),
        default="float32",
        help=f"ctranslate2: one of {', '.join(QUANTIZATIONS)}; onnx: one of {', '.join(ONNX_QUANTIZATIONS)}",
    )
    parser.add_argument(
        "--max_positions", type=int, default=1024, help="ctranslate2: rows of the position table written out"
    )
    args = parser.parse_args(argv)
    try:
        if args.to == "onnx":
            folder = export_onnx(args.model_dir, args.output_dir, args.quantization)
        else:
            folder = export_ctranslate2(args.model_dir, args.output_dir, args.quantization, args.max_positions)
    except (OSError, ValueError) as error:
        raise SystemExit(f"{prog}: {error}") from None
    print(
        f"Exported to {folder} ({args.quantization}); translate with: vanilla-transformer translate {folder} "
        f"--engine {args.to}"
    )
