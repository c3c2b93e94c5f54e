"""Score a trained model folder with sacreBLEU and chrF on a test split or on your own files.

Usage:
    vanilla-transformer score MODEL_DIR                       # the LibreOffice help EN-DE test split
    vanilla-transformer score MODEL_DIR --dataset libreoffice-ui --split test
    vanilla-transformer score MODEL_DIR --data_files test.tsv   # or src.txt,ref.txt
    vanilla-transformer score MODEL_DIR --tokenized_bleu --num_beams 1 --output hypotheses.txt
    vanilla-transformer score EXPORT_DIR --engine onnx          # or ctranslate2: a folder from `vanilla-transformer export`

Prints sacreBLEU with its signature, chrF, and (with --tokenized_bleu) the paper-style tokenized BLEU. A bad data
file (its file, line and what was expected), a missing model folder, or a source longer than --max_tokens tokens
(with every engine) ends the script with one line on standard error (exit status 1).
"""

import json
import sys
from pathlib import Path

import torch

from ..data.corpora import load_corpus
from ..data.splits import CorpusError
from ..deploy.engines import add_engine_argument, check_engine_arguments, load_export
from ..evaluation.metrics import compute_bleu
from ..evaluation.translation import add_max_tokens_argument, add_remote_code_argument, load_translator, translate
from ..utils.command_line import CommandParser


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    parser = CommandParser(prog, __doc__)
    parser.add_argument("model", help="model folder (or Hub id) with its tokenizer; an export with --engine")
    add_engine_argument(parser)
    parser.add_argument("--dataset", default="libreoffice-help")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--split", default="test")
    parser.add_argument("--data_files", help="local pairs: a TSV, a JSONL, or 'src.txt,ref.txt'")
    parser.add_argument("--num_beams", type=int, help="beam size (default: the model's, 4)")
    add_max_tokens_argument(parser)
    parser.add_argument("--tokenized_bleu", action="store_true", help="also the paper-style tokenized BLEU")
    parser.add_argument("--output", help="write the translations here, one per line")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_remote_code_argument(parser)
    args = parser.parse_args(argv)
    check_engine_arguments(parser, args)

    # 1. The pairs and the model; any problem with either is one line on standard error.
    try:
        if args.output and not Path(args.output).absolute().parent.is_dir():
            raise FileNotFoundError(f"the folder of --output {args.output} does not exist")
        if args.data_files:
            corpus = load_corpus(data_files=args.data_files, source_lang=args.source_lang, target_lang=args.target_lang)
            pairs = corpus["train"]
        else:
            corpus = load_corpus(args.dataset, args.source_lang, args.target_lang)
            if args.split not in corpus:
                raise ValueError(f"--split {args.split!r} is not one of {sorted(corpus)}")
            pairs = corpus[args.split]
        if args.engine == "torch":
            model, tokenizer = load_translator(args.model, args.device, trust_remote_code=args.trust_remote_code)
        else:
            engine = load_export(args.engine, args.model, args.device, workers=args.workers)
    except (OSError, ValueError, CorpusError, ImportError) as error:
        raise SystemExit(f"{prog}: {error}") from None

    # 2. Translate (every engine within --max_tokens), score, report.
    kwargs = {"max_tokens": args.max_tokens, **({"num_beams": args.num_beams} if args.num_beams else {})}
    sources, references = list(pairs["source"]), list(pairs["target"])
    try:
        if args.engine == "torch":
            hypotheses = translate(model, tokenizer, sources, **kwargs)
        else:
            hypotheses = engine.translate(sources, **kwargs)
    except ValueError as error:  # a source too long for --max_tokens (or for an export's positions), named
        raise SystemExit(f"{prog}: {error}") from None
    scores = compute_bleu(hypotheses, references, tokenized=args.tokenized_bleu)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.writelines(text + "\n" for text in hypotheses)
    keys = ("score", "signature", "chrf", "chrf_signature", "tokenized_bleu")
    summary = {key: scores[key] for key in keys if key in scores}
    summary["pairs"] = len(hypotheses)
    print(json.dumps(summary, indent=2, ensure_ascii=False))
