"""Export a trained model folder to CTranslate2 or ONNX (ONNX Runtime), for fast translation at volume, or as a
stock MarianMTModel folder that transformers loads with no remote code.

Usage:
    vanilla-transformer export MODEL_DIR OUT_DIR --to ctranslate2 [--quantization int8] [--max_positions 1024]
    vanilla-transformer export MODEL_DIR OUT_DIR --to onnx [--quantization int8]
    vanilla-transformer export MODEL_DIR OUT_DIR --format marian [--onnx] [--max_positions 1024] [--length_penalty A]
    vanilla-transformer translate OUT_DIR --engine ctranslate2|onnx < input.en > output.de

A CTranslate2 folder holds model.bin, the shared vocabulary, the tokenizer and a README saying how to translate with
it; an ONNX folder holds encoder.onnx, decoder_step.onnx, the tokenizer and a README. A Marian folder is a
MarianMTModel's (config, safetensors weights, tokenizer.json, generation config, a card saying what differs), loaded
by `AutoModelForSeq2SeqLM.from_pretrained(OUT_DIR)`, CTranslate2's and transformers.js's readers; with `--onnx` also
its graphs in Optimum's layout (onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx), which transformers.js runs
in a web page (examples/browser/). What maps where: `hf_vanilla_transformer/deploy/` and docs/deploy.md, docs/sharing.md.
A bad folder or value, or a model a format cannot hold, ends the script with one line.
"""

import sys
from pathlib import Path

from ..convert.marian_export import export_marian
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
    parser.add_argument(
        "--to",
        "--format",
        dest="to",
        choices=["ctranslate2", "onnx", "marian"],
        default="ctranslate2",
        help="the engine to export to, or marian: a stock MarianMTModel folder (no remote code)",
    )
    parser.add_argument("--onnx", action="store_true", help="marian: also its ONNX graphs in Optimum's layout")
    parser.add_argument(
        "--length_penalty",
        type=float,
        help="marian: transformers' length penalty alpha of its beam search (default: the model's GNMT alpha mapped)",
    )
    parser.add_argument(
        "--quantization",
        choices=sorted(set(QUANTIZATIONS) | set(ONNX_QUANTIZATIONS)),
        default="float32",
        help=f"ctranslate2: one of {', '.join(QUANTIZATIONS)}; onnx: one of {', '.join(ONNX_QUANTIZATIONS)}",
    )
    parser.add_argument(
        "--max_positions", type=int, default=1024, help="ctranslate2, marian: rows of the position table written out"
    )
    args = parser.parse_args(argv)
    if args.to != "marian" and (args.onnx or args.length_penalty is not None):
        raise SystemExit(f"{prog}: --onnx and --length_penalty apply to --format marian only.")
    if args.to == "marian" and args.quantization != "float32":
        raise SystemExit(f"{prog}: --quantization {args.quantization}: a Marian folder holds float32 weights.")
    try:
        if args.to == "marian":
            folder = export_marian(args.model_dir, args.output_dir, args.max_positions, args.length_penalty, args.onnx)
            print(f"Exported to {folder}: a MarianMTModel folder; load it with AutoModelForSeq2SeqLM.from_pretrained")
            return
        if args.to == "onnx":
            folder = export_onnx(args.model_dir, args.output_dir, args.quantization)
        else:
            folder = export_ctranslate2(args.model_dir, args.output_dir, args.quantization, args.max_positions)
    except (OSError, ValueError, ImportError, RuntimeError) as error:  # a bad folder or value, a missing extra
        raise SystemExit(f"{prog}: {str(error).strip().splitlines()[0]}") from None
    print(
        f"Exported to {folder} ({args.quantization}); translate with: vanilla-transformer translate {folder} "
        f"--engine {args.to}"
    )
