"""Draw the attention maps of a trained model for any sentence: encoder self-attention, decoder self-attention and
cross-attention, one heat map per layer and head.

Usage:
    vanilla-transformer plot-attention MODEL_DIR "Choose Format - Cells." [--translation "..."] [--output_dir DIR]

By default the model translates the sentence itself (its default beam search) and the maps show how it did;
`--translation` shows the attention for a given target sentence instead. The PNGs go to DIR (default
MODEL_DIR/plots): attention_encoder.png, attention_decoder.png, attention_cross.png.
"""

import sys
from pathlib import Path

from transformers import AutoTokenizer

from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from ..sharing.plots import attention_maps, plot_attention_maps
from ..utils.command_line import CommandParser


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    parser = CommandParser(prog, __doc__)
    parser.add_argument("model_dir")
    parser.add_argument("sentence")
    parser.add_argument("--translation", help="the target sentence to attend over (default: the model's own)")
    parser.add_argument("--output_dir", help="where to write the PNGs (default: MODEL_DIR/plots)")
    options = parser.parse_args(argv)
    model = VanillaTransformerForConditionalGeneration.from_pretrained(options.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(options.model_dir)
    output_dir = Path(options.output_dir or Path(options.model_dir) / "plots")
    maps = attention_maps(model, tokenizer, options.sentence, options.translation)
    print(f"source:      {options.sentence}\ntranslation: {maps['translation']}")
    for path in plot_attention_maps(maps, output_dir):
        print(f"wrote {path}")
