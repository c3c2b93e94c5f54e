"""Translate a file (or standard input), one sentence per line, with a trained model folder.

Usage:
    python scripts/translate.py MODEL_DIR < input.en > output.de
    python scripts/translate.py MODEL_DIR --input input.en --output output.de --num_beams 4 --max_tokens 4000

Sentences are batched by length (longest first) and written back in input order. Decoding uses the model's
generation config (the paper's beam 4, GNMT length penalty 0.6, source length + 50) unless a flag overrides it.
"""

import argparse
import sys

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_vanilla_transformer.inference import translate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="model folder (or Hub id) with its tokenizer")
    parser.add_argument("--input", help="input file (default: standard input)")
    parser.add_argument("--output", help="output file (default: standard output)")
    parser.add_argument("--num_beams", type=int, help="beam size (default: the model's, 4)")
    parser.add_argument("--max_tokens", type=int, default=4000, help="padded source tokens per batch")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    model = AutoModelForSeq2SeqLM.from_pretrained(args.model, trust_remote_code=True).to(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if args.input:
        with open(args.input, encoding="utf-8") as handle:
            lines = [line.rstrip("\n") for line in handle]
    else:
        lines = [line.rstrip("\n") for line in sys.stdin]
    kwargs = {"num_beams": args.num_beams} if args.num_beams else {}
    outputs = translate(model, tokenizer, lines, max_tokens=args.max_tokens, progress=sys.stderr.isatty(), **kwargs)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.writelines(text + "\n" for text in outputs)
    else:
        sys.stdout.writelines(text + "\n" for text in outputs)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
