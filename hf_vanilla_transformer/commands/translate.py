"""Translate a file (or standard input), one sentence per line, with a trained model folder.

Usage:
    vanilla-transformer translate MODEL_DIR < input.en > output.de
    vanilla-transformer translate MODEL_DIR --input input.en --output output.de --num_beams 4 --max_tokens 4000
    vanilla-transformer translate CT2_DIR --engine ctranslate2 < input.en   # a folder from `vanilla-transformer export`
    vanilla-transformer translate ONNX_DIR --engine onnx < input.en          # likewise (--to onnx)

Sentences are batched by length (longest first) and written back in input order; an empty or blank line gives an
empty line without running the model. Decoding uses the model's generation config (the paper's beam 4, GNMT length
penalty 0.6, source length + 50) unless a flag overrides it. `--compile auto` compiles the decoding step where it pays: on CUDA from
4,000 sentences (an estimate, docs/gpu.md), never on a CPU (real input decodes faster eager there, docs/speed.md). A
missing or unreadable input file (bytes that are not UTF-8 included) or model folder, or a line longer than
--max_tokens tokens (with every engine, as with an export's own position limit), ends the command with one line
saying what was expected (exit status 1). The model is this package's; a folder's own code runs only with
--trust_remote_code.
"""

import io
import sys
from pathlib import Path

import torch

from ..data.corpora import decode_text, read_text
from ..deploy.engines import add_engine_argument, check_engine_arguments, load_export
from ..evaluation.translation import (
    COMPILE_CHOICES,
    add_max_tokens_argument,
    add_remote_code_argument,
    load_translator,
    translate,
)
from ..utils.command_line import CommandParser


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    parser = CommandParser(prog, __doc__)
    parser.add_argument("model", help="model folder (or Hub id) with its tokenizer; an export with --engine")
    add_engine_argument(parser)
    parser.add_argument("--input", help="input file (default: standard input)")
    parser.add_argument("--output", help="output file (default: standard output)")
    parser.add_argument("--num_beams", type=int, help="beam size (default: the model's, 4)")
    add_max_tokens_argument(parser)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_remote_code_argument(parser)
    parser.add_argument(
        "--compile",
        choices=COMPILE_CHOICES,
        default="auto",
        help="decode with a static cache and a compiled step: always, never, or where the input is long enough for "
        "it to pay (auto; same tokens either way)",
    )
    args = parser.parse_args(argv)
    check_engine_arguments(parser, args)

    # 1. Read the input and the model; any problem with either is one line on standard error.
    try:
        if args.output and not Path(args.output).absolute().parent.is_dir():
            raise FileNotFoundError(f"the folder of --output {args.output} does not exist")
        text = read_text(args.input) if args.input else decode_text(sys.stdin.buffer.read(), "<stdin>")
        if args.engine == "torch":
            model, tokenizer = load_translator(args.model, args.device, trust_remote_code=args.trust_remote_code)
        else:
            engine = load_export(args.engine, args.model, args.device, workers=args.workers)
    except (OSError, ValueError, ImportError) as error:
        raise SystemExit(f"{prog}: {error}") from None
    lines = [line.rstrip("\n") for line in io.StringIO(text, newline=None)]  # one sentence per line, as `open`

    # 2. Translate and write in input order, every engine within --max_tokens.
    kwargs = {"max_tokens": args.max_tokens, **({"num_beams": args.num_beams} if args.num_beams else {})}
    try:
        if args.engine == "torch":
            outputs = translate(model, tokenizer, lines, progress=sys.stderr.isatty(), compile=args.compile, **kwargs)
        else:
            outputs = engine.translate(lines, **kwargs)
    except ValueError as error:  # a line too long for --max_tokens (or for an export's positions), named
        raise SystemExit(f"{prog}: {error}") from None
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as handle:
                handle.writelines(sentence + "\n" for sentence in outputs)
        except OSError as error:
            raise SystemExit(f"{prog}: cannot write --output {args.output}: {error.strerror}") from None
    else:
        sys.stdout.writelines(sentence + "\n" for sentence in outputs)
        sys.stdout.flush()
