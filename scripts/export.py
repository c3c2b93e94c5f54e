"""Export a trained model folder to CTranslate2 or ONNX (ONNX Runtime), for fast translation at volume.

Usage:
    python scripts/export.py MODEL_DIR OUT_DIR --to ctranslate2 [--quantization int8] [--max_positions 1024]
    python scripts/export.py MODEL_DIR OUT_DIR --to onnx [--quantization int8]
    python scripts/translate.py OUT_DIR --engine ctranslate2|onnx < input.en > output.de

A CTranslate2 folder holds model.bin, the shared vocabulary, the tokenizer and a README saying how to translate with
it; an ONNX folder holds encoder.onnx, decoder_step.onnx, the tokenizer and a README. What maps where, and what
CTranslate2 decodes differently (its beam-search length penalty): `hf_vanilla_transformer/export.py`,
`hf_vanilla_transformer/export_onnx.py` and docs/deploy.md. A bad folder or value ends the script with one line.
"""

import argparse

from hf_vanilla_transformer.deploy.ctranslate2 import QUANTIZATIONS, export_ctranslate2
from hf_vanilla_transformer.deploy.onnx import ONNX_QUANTIZATIONS, export_onnx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", help="a model folder written by scripts/train.py or scripts/main.py")
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
    args = parser.parse_args()
    try:
        if args.to == "onnx":
            folder = export_onnx(args.model_dir, args.output_dir, args.quantization)
        else:
            folder = export_ctranslate2(args.model_dir, args.output_dir, args.quantization, args.max_positions)
    except (OSError, ValueError) as error:
        raise SystemExit(f"export.py: {error}") from None
    print(
        f"Exported to {folder} ({args.quantization}); translate with: python scripts/translate.py {folder} "
        f"--engine {args.to}"
    )


if __name__ == "__main__":
    main()
