"""The stock MarianMTModel folder (`convert/marian_export.py`) as ONNX graphs in the layout Optimum writes and
transformers.js and Optimum's `ORTModelForSeq2SeqLM` read (`vanilla-transformer export MODEL_DIR OUT --format marian --onnx`):

- `onnx/encoder_model.onnx`: (`input_ids`, `attention_mask`) -> `last_hidden_state`;
- `onnx/decoder_model_merged.onnx`: one decoder pass with a cache, the first one included: (`input_ids`,
  `encoder_attention_mask`, `encoder_hidden_states`, `past_key_values.{i}.decoder.key` / `.value` of the steps so far,
  empty at the first step) -> `logits`, `present.{i}.decoder.key` / `.value` (this pass appended) and
  `present.{i}.encoder.key` / `.value` (the encoder-decoder attention's keys and values).

Optimum writes these files from a MarianMTModel where it supports the installed transformers; `optimum-onnx` 0.1.0,
the newest, supports transformers < 4.58 and this package targets 5.x, so the package writes them itself, from
transformers' own `MarianMTModel` modules (`torch.onnx.export(dynamo=True)`), with Optimum's names and dimension names
(`batch_size`, `encoder_sequence_length`, `decoder_sequence_length`, `past_decoder_sequence_length`): a reader sizes
an empty first cache by them. Optimum's merged decoder holds two branches (`use_cache_branch`), the second reusing the
encoder-decoder keys and values passed back in; this one computes them from `encoder_hidden_states` at every pass
(which both readers pass at every step, and which keeps the graph one branch), so it takes no encoder cache and no
`use_cache_branch`, inputs the readers feed only where a graph declares them.
"""

from __future__ import annotations

from pathlib import Path

import torch


ENCODER_FILE = "onnx/encoder_model.onnx"
DECODER_FILE = "onnx/decoder_model_merged.onnx"
OPSET = 18


def past_names(layers: int, prefix: str = "past_key_values") -> list[str]:
    """Optimum's names of a decoder's self-attention cache, layer by layer: `{prefix}.{i}.decoder.key`, `.value`."""
    return [f"{prefix}.{i}.decoder.{kind}" for i in range(layers) for kind in ("key", "value")]


def present_names(layers: int) -> list[str]:
    """Optimum's names of the merged decoder's cache outputs, layer by layer: the self-attention's then the
    encoder-decoder attention's keys and values."""
    return [
        f"present.{i}.{side}.{kind}"
        for i in range(layers)
        for side in ("decoder", "encoder")
        for kind in ("key", "value")
    ]


def marian_graphs(marian):
    """The two `torch.nn.Module`s exported, sharing `marian`'s (a MarianMTModel's) weights: (encoder, merged
    decoder)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    layers = marian.config.decoder_layers

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.marian = marian

        def forward(self, input_ids, attention_mask):
            return self.marian.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    class MergedDecoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.marian = marian

        def forward(self, input_ids, encoder_attention_mask, encoder_hidden_states, *past):
            self_cache = DynamicCache()
            for i in range(layers):
                self_cache.update(past[2 * i], past[2 * i + 1], i)
            cache = EncoderDecoderCache(self_cache, DynamicCache())  # the cross-attention's computed afresh
            out = self.marian.model.decoder(
                input_ids=input_ids,
                encoder_hidden_states=encoder_hidden_states,
                encoder_attention_mask=encoder_attention_mask,
                cache=cache,
                use_cache=True,
            )
            logits = self.marian.lm_head(out.last_hidden_state) + self.marian.final_logits_bias
            caches = out.cache
            present = []
            for i in range(layers):
                mine, cross = caches.self_attention_cache.layers[i], caches.cross_attention_cache.layers[i]
                present += [mine.keys, mine.values, cross.keys, cross.values]
            return (logits, *present)

    return Encoder().eval(), MergedDecoder().eval()


def _samples(config):
    """Example inputs: two sentences, one padded, two target tokens, three cached steps (no dimension of size 0 or
    1, which the exporter would fix rather than keep dynamic)."""
    ids = torch.tensor([[5, 6, 7, 8, config.eos_token_id], [9, 10, config.eos_token_id, 0, 0]]) % config.vocab_size
    ids[1, 3:] = config.pad_token_id
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    heads = config.decoder_attention_heads
    head_dim = config.d_model // heads
    past = [torch.zeros(2, heads, 3, head_dim) for _ in range(2 * config.decoder_layers)]
    target = torch.tensor([[config.decoder_start_token_id, 11], [config.decoder_start_token_id, 12]])
    return ids, mask, target, past


# Each graph's inputs and outputs: their dimensions by Optimum's names (None: static).
BATCH, SOURCE, TARGET, PAST = (
    "batch_size",
    "encoder_sequence_length",
    "decoder_sequence_length",
    "past_decoder_sequence_length",
)


def export_marian_onnx(marian, output_dir: str | Path, opset: int = OPSET) -> list[Path]:
    """Write `marian`'s encoder and merged decoder as ONNX files into `output_dir` (`ENCODER_FILE`, `DECODER_FILE`),
    with Optimum's input, output and dimension names; returns their paths."""
    import onnx

    output_dir = Path(output_dir)
    (output_dir / "onnx").mkdir(parents=True, exist_ok=True)
    config, layers = marian.config, marian.config.decoder_layers
    encoder, decoder = marian_graphs(marian.eval())
    ids, mask, target, past = _samples(config)
    batch, source, length, cached = (torch.export.Dim(name) for name in ("batch", "source", "target", "past"))
    with torch.no_grad():
        hidden = encoder(ids, mask)
        specs = [
            (
                encoder, (ids, mask), ({0: batch, 1: source}, {0: batch, 1: source}),
                ["input_ids", "attention_mask"], ["last_hidden_state"], ENCODER_FILE,
                {"input_ids": (BATCH, SOURCE), "attention_mask": (BATCH, SOURCE),
                 "last_hidden_state": (BATCH, SOURCE, None)},
            ),
            (
                decoder, (target, mask, hidden, *past),
                ({0: batch, 1: length}, {0: batch, 1: source}, {0: batch, 1: source},
                 tuple({0: batch, 2: cached} for _ in past)),
                ["input_ids", "encoder_attention_mask", "encoder_hidden_states", *past_names(layers)],
                ["logits", *present_names(layers)], DECODER_FILE,
                {"input_ids": (BATCH, TARGET), "encoder_attention_mask": (BATCH, SOURCE),
                 "encoder_hidden_states": (BATCH, SOURCE, None), "logits": (BATCH, TARGET, None),
                 **{name: (BATCH, None, PAST, None) for name in past_names(layers)},
                 **{name: (BATCH, None, f"{PAST} + {TARGET}" if ".decoder." in name else SOURCE, None)
                    for name in present_names(layers)}},
            ),
        ]  # fmt: skip
        paths = []
        for module, inputs, shapes, inputs_named, outputs_named, file, dims in specs:
            program = torch.onnx.export(
                module,
                inputs,
                dynamic_shapes=shapes,
                input_names=inputs_named,
                output_names=outputs_named,
                opset_version=opset,
                dynamo=True,
                verbose=False,
            )
            path = output_dir / file
            program.save(str(path))
            graph = onnx.load(str(path))
            _name_dimensions(graph, dims)
            onnx.save(graph, str(path))
            paths.append(path)
    return paths


def _name_dimensions(model, dims: dict[str, tuple]) -> None:
    """Rename the dynamic dimensions of `model`'s inputs and outputs to Optimum's (`dims`: name -> each dimension's
    name, None for a static one, which is left as it is)."""
    for value in [*model.graph.input, *model.graph.output]:
        names = dims.get(value.name)
        if names is None:
            continue
        for dimension, name in zip(value.type.tensor_type.shape.dim, names, strict=True):
            if name is not None and not dimension.HasField("dim_value"):
                dimension.dim_param = name
