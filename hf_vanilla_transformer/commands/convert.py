"""Convert a translation model that exists elsewhere into a model folder of this package, with the same logits.

Usage:
    vanilla-transformer convert MARIAN_FOLDER OUTPUT_DIR [--source_id Helsinki-NLP/opus-mt-en-de]
    vanilla-transformer convert FSMT_FOLDER OUTPUT_DIR [--source_id facebook/wmt19-en-de]
    vanilla-transformer convert FAIRSEQ_CHECKPOINT_OR_FOLDER OUTPUT_DIR [--source_dict dict.en.txt]
        [--target_dict dict.de.txt] [--bpe_codes bpecodes]

SOURCE is a MarianMTModel folder or an FSMT folder (config.json, weights, tokenizer files), a fairseq checkpoint of
the `transformer` family, or a folder holding one as fairseq's archives unpack (model.pt, dict.<lang>.txt,
bpecodes). OUTPUT_DIR gets config, safetensors weights, the source's decoding settings, its tokenizer, the
remote-code files and a model card. A source this model cannot hold is refused in one line naming what is missing,
before anything is written. Each family's quirks and how they map: docs/converting.md.
"""

import sys
from pathlib import Path

from ..convert import convert_model
from ..utils.command_line import CommandParser


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    parser = CommandParser(prog, __doc__)
    parser.add_argument("source", help="a MarianMTModel or FSMT folder, or a fairseq checkpoint (or its folder)")
    parser.add_argument("output_dir", help="the model folder to write (new, or empty)")
    parser.add_argument("--source_dict", help="fairseq: the source dictionary (default: dict.<source_lang>.txt beside)")
    parser.add_argument("--target_dict", help="fairseq: the target dictionary (default: dict.<target_lang>.txt beside)")
    parser.add_argument("--bpe_codes", help="fairseq: the BPE codes (default: bpecodes or code beside the checkpoint)")
    parser.add_argument("--source_id", help="the source's Hub id, named in the model card (base_model)")
    args = parser.parse_args(argv)
    try:
        folder = convert_model(
            args.source, args.output_dir, args.source_dict, args.target_dict, args.bpe_codes, args.source_id
        )
    except (ValueError, OSError) as error:  # ConversionError among them: one line naming what is missing
        raise SystemExit(f"{prog}: {error}") from None
    print(f"Converted {args.source} into {folder}; translate with: vanilla-transformer translate {folder}")
