"""Export a trained model folder to ONNX and translate with ONNX Runtime, without PyTorch at translation time.

Two graphs, exported with `torch.onnx.export(dynamo=True)` from the model's own modules:

- `encoder.onnx`: (input_ids, attention_mask) -> the encoder-decoder attention keys and values of every decoder layer
  (`cross_keys_0`, `cross_values_0`, ...: (batch, heads, source, d_k)), projected once per source as CTranslate2 and
  `generate()`'s cache do;
- `decoder_step.onnx`: one decoding step, (decoder_input_ids (batch, 1), attention_mask, those keys and values, the
  self-attention keys and values of the steps so far (`past_keys_0`, ...: (batch, heads, past, d_k))) -> the next
  token's log-probabilities and the self-attention keys and values with this step appended (`present_keys_0`, ...). The step runs the model's own
  `VanillaTransformerForConditionalGeneration.forward` on a cache built from the inputs, so positions, masks and
  layers are the ones `generate()` uses.

Batch, source and past lengths are dynamic. The search around the step (`OnnxTranslator`, in `onnx_translator.py`) is NumPy: `generate()`'s
beam search step for step, with the model's decoding rules (§6.1 by default: GNMT's length penalty, at most source
length + 50 tokens, a sentence done once it has `num_beams` finished hypotheses; transformers' `|Y|^alpha` penalty
and `early_stopping=False` or `"never"` where the model's generation config says so), and greedy search as one
beam. transformers' own `transformers.exporters` captures the forward calls of `generate()`, whose encoder runs
outside `forward`, and leaves the search to PyTorch; these two graphs need neither.

`onnx`, `onnxscript` (export) and `onnxruntime` (translation) are optional (`pip install
hf_vanilla_transformer[deploy]`), imported when used.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..data.tokenizer import copy_tokenizer_files
from .rules import EXPORT_INFO, PENALTY_NAMES, recorded_decoding


ONNX_QUANTIZATIONS = ("float32", "int8")
ONNX_FILES = ("encoder.onnx", "decoder_step.onnx")


def cache_names(layers: int) -> tuple[list[str], list[str], list[str]]:
    """Names of the step's cache inputs and outputs, one tensor per layer: cross-attention keys and values,
    self-attention keys and values so far, and the self-attention keys and values with this step appended."""
    cross = [f"cross_{kind}_{i}" for i in range(layers) for kind in ("keys", "values")]
    past = [f"past_{kind}_{i}" for i in range(layers) for kind in ("keys", "values")]
    present = [f"present_{kind}_{i}" for i in range(layers) for kind in ("keys", "values")]
    return cross, past, present


def onnx_graphs(model):
    """The two `torch.nn.Module`s exported to ONNX, sharing `model`'s weights: (encoder, decoder step). Caches go in
    and out one tensor per layer, so that no step splits or stacks them."""
    import torch
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    layers = model.config.decoder_layers

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            hidden = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            projected = [layer.encoder_attn._project_keys_values(hidden) for layer in self.model.model.decoder.layers]
            return tuple(tensor for pair in projected for tensor in pair)  # keys 0, values 0, keys 1, ...

    class DecoderStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, decoder_input_ids, attention_mask, *caches):
            cross, past = caches[: 2 * layers], caches[2 * layers :]
            self_cache, cross_cache = DynamicCache(), DynamicCache()
            for i in range(layers):
                self_cache.update(past[2 * i], past[2 * i + 1], i)
                cross_cache.update(cross[2 * i], cross[2 * i + 1], i)
            cache = EncoderDecoderCache(self_cache, cross_cache)
            for i in range(layers):
                cache.is_updated[i] = True  # the cross-attention keys and values are the inputs'
            # The decoder reads only the shape of the encoder output once its keys and values are cached.
            batch, source = attention_mask.shape
            encoder_output = cross[0].new_zeros(()).expand(batch, source, self.model.config.d_model)
            out = self.model(
                encoder_outputs=(encoder_output,),
                attention_mask=attention_mask,
                decoder_input_ids=decoder_input_ids,
                cache=cache,
                use_cache=True,
            )
            log_probs = out.logits[:, -1].float().log_softmax(-1)  # (B, V)
            present = out.cache.self_attention_cache.layers
            return (log_probs, *(tensor for layer in present for tensor in (layer.keys, layer.values)))

    return Encoder().eval(), DecoderStep().eval()


def _sample_inputs(model):
    """Example inputs of both graphs: two sentences, one padded, three cached steps (no dimension of size 0 or 1,
    which the exporter would fix rather than keep dynamic)."""
    import torch

    config = model.config
    ids = torch.tensor([[5, 6, 7, 8, config.eos_token_id], [9, 10, config.eos_token_id, 0, 0]]) % config.vocab_size
    ids[1, 3:] = config.pad_token_id
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    head_dim, value_dim = config.head_dims(config.decoder_attention_heads)
    past = (2, config.decoder_attention_heads, 3)
    caches = [torch.zeros(*past, dim) for _ in range(config.decoder_layers) for dim in (head_dim, value_dim)]
    return (ids, mask), (torch.full((2, 1), config.decoder_start_token_id), mask), caches


def export_onnx(
    model_dir: str | Path,
    output_dir: str | Path,
    quantization: str = "float32",
    opset: int = 18,
    attention: str = "eager",
) -> Path:
    """Export the model folder `model_dir` (with its tokenizer) to `output_dir`: `encoder.onnx`,
    `decoder_step.onnx`, the tokenizer files, `EXPORT_INFO` and a README saying how to translate with it.
    `quantization="int8"` quantizes the weights of the matrix products (ONNX Runtime's dynamic quantization).
    `attention` is the attention implementation traced: "eager" (the default: its graph ran 15% faster than "sdpa"'s
    in ONNX Runtime on a 2-core AVX2 CPU) or "sdpa"."""
    import torch
    from transformers import AutoTokenizer

    from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration

    if quantization not in ONNX_QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r} is invalid; expected one of {ONNX_QUANTIZATIONS}.")
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir} holds no config.json; expected a model folder saved by this package.")
    model = VanillaTransformerForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=attention
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if len(tokenizer) != model.config.vocab_size:
        raise ValueError(
            f"The tokenizer has {len(tokenizer)} tokens; the model's vocab_size is {model.config.vocab_size}."
        )
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, program in zip(ONNX_FILES, _export_programs(model, opset), strict=True):
        program.save(str(output_dir / name))
        if quantization == "int8":
            _quantize_int8(output_dir / name)
    copy_tokenizer_files(model_dir, output_dir)
    info = _export_info(model, quantization, opset, model_dir)
    (output_dir / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    (output_dir / "README.md").write_text(_readme(info), encoding="utf-8")
    return output_dir


def _export_programs(model, opset: int) -> list:
    """The ONNX programs of the encoder and the decoding step (`torch.onnx.export(dynamo=True)`), with the batch,
    source and past lengths dynamic."""
    import torch

    encoder, step = onnx_graphs(model)
    (ids, mask), step_inputs, past = _sample_inputs(model)
    cross_names, past_names, present_names = cache_names(model.config.decoder_layers)
    batch, source, length = (torch.export.Dim(name) for name in ("batch", "source", "past"))
    with torch.no_grad():
        cross = encoder(ids, mask)
        graphs = [
            (encoder, (ids, mask), ({0: batch, 1: source},) * 2, ["input_ids", "attention_mask"], cross_names),
            (
                step,
                (*step_inputs, *cross, *past),
                # `*caches` is one argument to torch.export: its shapes are one tuple
                (
                    {0: batch},
                    {0: batch, 1: source},
                    (*[{0: batch, 2: source}] * len(cross), *[{0: batch, 2: length}] * len(past)),
                ),
                ["decoder_input_ids", "attention_mask", *cross_names, *past_names],
                ["log_probs", *present_names],
            ),
        ]
        return [
            torch.onnx.export(
                module,
                inputs,
                dynamic_shapes=shapes,
                input_names=input_names,
                output_names=output_names,
                opset_version=opset,
                dynamo=True,
                verbose=False,
            )
            for module, inputs, shapes, input_names, output_names in graphs
        ]


def _export_info(model, quantization: str, opset: int, model_dir: Path) -> dict:
    """What the search needs that the graphs do not say: special ids, cache shapes, the decoding rules."""
    config = model.config
    return {
        "format": "onnx",
        "quantization": quantization,
        "opset": opset,
        "pad_token_id": config.pad_token_id,
        "eos_token_id": config.eos_token_id,
        "decoder_start_token_id": config.decoder_start_token_id,
        "decoder_layers": config.decoder_layers,
        "decoder_attention_heads": config.decoder_attention_heads,
        "head_dims": list(config.head_dims(config.decoder_attention_heads)),
        "max_source_tokens": config.max_position_embeddings if config.position_embedding_type == "learned" else None,
        "generation": recorded_decoding(model.generation_config),
        "source": Path(model_dir).resolve().name,  # the model folder by its name: no local path is recorded
    }


def _quantize_int8(path: Path) -> None:
    """Replace the graph at `path` by its dynamically quantized form (int8 weights of the matrix products)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = path.with_name(path.stem + ".int8.onnx")
    quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8)
    for leftover in path.parent.glob(path.name + "*"):  # the float graph and its external data, if any
        leftover.unlink()
    quantized.rename(path)


def _readme(info: dict) -> str:
    return f"""# A Vanilla Transformer for ONNX Runtime

Exported by `hf_vanilla_transformer` (`scripts/export.py --to onnx`, {info["quantization"]}, opset {info["opset"]}):
`encoder.onnx` gives the encoder-decoder attention keys and values of every decoder layer for a batch of sources;
`decoder_step.onnx` takes one target token per sentence with those and the self-attention keys and values of the
steps so far, and gives the next token's log-probabilities and the keys and values with this step appended.
`{EXPORT_INFO}` holds the special token ids and the model's decoding defaults
(beam search with {info["generation"]["num_beams"]} beams, {PENALTY_NAMES[info["generation"]["length_penalty_type"]]} length penalty
alpha {info["generation"]["length_penalty"]}, early stopping {info["generation"]["early_stopping"]!r}, at most source length +
{info["generation"]["relative_max_length"]} tokens).

With the package (PyTorch is not needed to translate):

```python
from hf_vanilla_transformer.deploy.onnx_translator import OnnxTranslator

translator = OnnxTranslator("THIS_FOLDER", threads=2)
print(translator.translate(["Choose Format - Cells."]))
```

or `python scripts/translate.py THIS_FOLDER --engine onnx < input.txt`.
"""
