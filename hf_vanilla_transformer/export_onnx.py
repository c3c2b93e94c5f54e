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

Batch, source and past lengths are dynamic. The search around the step (`OnnxTranslator`) is NumPy: `generate()`'s
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
import shutil
from pathlib import Path

import numpy as np


ONNX_QUANTIZATIONS = ("float32", "int8")
ONNX_INFO = "hf_vanilla_transformer_export.json"  # the same file name as the CTranslate2 export's
ONNX_FILES = ("encoder.onnx", "decoder_step.onnx")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
PENALTY_NAMES = {"gnmt": "GNMT's ((5 + |Y|) / 6)^alpha", "hf": "transformers' |Y|^alpha"}
EARLY_STOPPING = (True, False, "never")


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
    `decoder_step.onnx`, the tokenizer files, `ONNX_INFO` and a README saying how to translate with it.
    `quantization="int8"` quantizes the weights of the matrix products (ONNX Runtime's dynamic quantization).
    `attention` is the attention implementation traced: "eager" (the default: its graph ran 15% faster than "sdpa"'s
    in ONNX Runtime on a 2-core AVX2 CPU) or "sdpa"."""
    import torch
    from transformers import AutoTokenizer

    from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration

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
    encoder, step = onnx_graphs(model)
    (ids, mask), step_inputs, past = _sample_inputs(model)
    cross_names, past_names, present_names = cache_names(model.config.decoder_layers)
    output_dir.mkdir(parents=True, exist_ok=True)
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
        for name, (module, inputs, shapes, input_names, output_names) in zip(ONNX_FILES, graphs, strict=True):
            program = torch.onnx.export(
                module,
                inputs,
                dynamic_shapes=shapes,
                input_names=input_names,
                output_names=output_names,
                opset_version=opset,
                dynamo=True,
                verbose=False,
            )
            path = output_dir / name
            program.save(str(path))
            if quantization == "int8":
                _quantize_int8(path)
    for name in TOKENIZER_FILES:
        if (model_dir / name).exists():
            shutil.copy2(model_dir / name, output_dir / name)
    config = model.config
    generation = model.generation_config
    info = {
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
        "generation": recorded_decoding(generation),
        "source": str(model_dir),
    }
    (output_dir / ONNX_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    (output_dir / "README.md").write_text(_readme(info), encoding="utf-8")
    return output_dir


def recorded_decoding(generation) -> dict:
    """The decoding rules of a `GenerationConfig` that the search follows, unset values as generate() reads them
    (alpha 1.0, transformers' |Y|^alpha penalty, no early stopping)."""
    return {
        "num_beams": generation.num_beams,
        "length_penalty": 1.0 if generation.length_penalty is None else generation.length_penalty,
        "length_penalty_type": getattr(generation, "length_penalty_type", None) or "hf",
        "early_stopping": False if generation.early_stopping is None else generation.early_stopping,
        "relative_max_length": getattr(generation, "relative_max_length", 50),
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
`{ONNX_INFO}` holds the special token ids and the model's decoding defaults
(beam search with {info["generation"]["num_beams"]} beams, {PENALTY_NAMES[info["generation"]["length_penalty_type"]]} length penalty
alpha {info["generation"]["length_penalty"]}, early stopping {info["generation"]["early_stopping"]!r}, at most source length +
{info["generation"]["relative_max_length"]} tokens).

With the package (PyTorch is not needed to translate):

```python
from hf_vanilla_transformer.export_onnx import OnnxTranslator

translator = OnnxTranslator("THIS_FOLDER", threads=2)
print(translator.translate(["Choose Format - Cells."]))
```

or `python scripts/translate.py THIS_FOLDER --engine onnx < input.txt`.
"""


def decoding_arguments(
    defaults: dict, num_beams: int | None, length_penalty: float | None, relative_max_length: int | None, batch: int
) -> tuple[int, float, int]:
    """An export translator's decoding for one call: each value given, else the export's default (the model's);
    a bad number of beams or batch size is named."""
    num_beams = defaults["num_beams"] if num_beams is None else num_beams
    length_penalty = defaults["length_penalty"] if length_penalty is None else length_penalty
    relative_max_length = defaults["relative_max_length"] if relative_max_length is None else relative_max_length
    for name, value in (("num_beams", num_beams), ("max_batch_size", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid; expected an integer >= 1.")
    return num_beams, length_penalty, relative_max_length


class OnnxTranslator:
    """An ONNX folder written by `export_onnx`, translating lists of sentences with ONNX Runtime like `translate()`:
    §6.1's beam search (or greedy search with `num_beams=1`), batched by source length, output in input order."""

    def __init__(self, folder: str | Path, threads: int = 0, providers: list[str] | None = None):
        import onnxruntime
        from tokenizers import Tokenizer

        folder = Path(folder)
        info_file = folder / ONNX_INFO
        if not info_file.exists():
            raise FileNotFoundError(f"{folder} holds no {ONNX_INFO}; expected a folder written by scripts/export.py.")
        self.info = json.loads(info_file.read_text(encoding="utf-8"))
        if self.info.get("format") != "onnx":
            raise ValueError(f"{folder} holds a {self.info.get('format')} export; expected an ONNX one (--to onnx).")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        providers = providers or ["CPUExecutionProvider"]
        self.encoder, self.step = (
            onnxruntime.InferenceSession(str(folder / name), options, providers=providers) for name in ONNX_FILES
        )
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # The rules recorded_decoding wrote; exports written before the last two were searched with GNMT's
        # penalty and early stopping.
        self.defaults = {"length_penalty_type": "gnmt", "early_stopping": True} | self.info["generation"]

    def encode(self, sentences: list[str]) -> list[list[int]]:
        """Source ids with `</s>` appended, as the package's tokenizer gives them."""
        encodings = self.tokenizer.encode_batch(sentences, add_special_tokens=False)
        ids = [[*encoding.ids, self.info["eos_token_id"]] for encoding in encodings]
        limit = self.info.get("max_source_tokens")
        for sentence, source in zip(sentences, ids, strict=True):
            if limit is not None and len(source) > limit:
                raise ValueError(
                    f"A source of {len(source)} tokens is longer than the model's {limit} learned positions: "
                    f"{sentence[:60]!r}..."
                )
        return ids

    def translate(
        self,
        sentences: list[str],
        num_beams: int | None = None,
        length_penalty: float | None = None,
        relative_max_length: int | None = None,
        max_batch_size: int = 32,
        length_penalty_type: str | None = None,
        early_stopping: bool | str | None = None,
    ) -> list[str]:
        """Translations in input order, empty and whitespace-only sentences kept empty; the model's decoding
        defaults (from the export) unless given."""
        num_beams, alpha, relative = decoding_arguments(
            self.defaults, num_beams, length_penalty, relative_max_length, max_batch_size
        )
        rules = {
            "length_penalty_type": length_penalty_type or self.defaults["length_penalty_type"],
            "early_stopping": self.defaults["early_stopping"] if early_stopping is None else early_stopping,
        }
        outputs = [""] * len(sentences)
        texts = [i for i, sentence in enumerate(sentences) if sentence.strip()]
        if not texts:
            return outputs
        sources = self.encode([sentences[i] for i in texts])
        order = sorted(range(len(texts)), key=lambda i: -len(sources[i]))  # longest first: little padding
        for start in range(0, len(order), max_batch_size):
            chunk = order[start : start + max_batch_size]
            ids = self.search([sources[i] for i in chunk], num_beams, alpha, relative, **rules)
            for i, tokens in zip(chunk, ids, strict=True):
                outputs[texts[i]] = self.tokenizer.decode(tokens, skip_special_tokens=True).strip()
        return outputs

    def search(
        self,
        sources: list[list[int]],
        num_beams: int,
        alpha: float,
        relative_max_length: int,
        length_penalty_type: str = "gnmt",
        early_stopping: bool | str = True,
    ) -> list[list[int]]:
        """The generated ids (without the start token, with the final `</s>` if one was produced) of each source.

        `generate()`'s beam search, sentence by sentence: each step scores every running beam's continuations,
        keeps the 2 x num_beams best; those among the best num_beams that end the sentence (`</s>`, or the
        sentence's length limit) become finished hypotheses ranked by log P(Y) / lp(|Y|) (GNMT's
        lp = ((5 + |Y|) / 6)^alpha, or transformers' |Y|^alpha), the best num_beams of the others run on. A sentence
        is done once it has num_beams finished hypotheses (`early_stopping=True`), or, with False or "never", once its
        best running hypothesis divided by lp(its length now; for "never" with alpha > 0, the batch's longest allowed
        length, so that the result depends on the batch, as generate()'s does) cannot beat the worst of them,
        transformers' heuristic; its translation is the best finished hypothesis.
        Finished sentences leave the batch. One beam is greedy search.
        """
        if length_penalty_type not in PENALTY_NAMES:
            raise ValueError(
                f"length_penalty_type={length_penalty_type!r} is invalid; expected one of {tuple(PENALTY_NAMES)}."
            )
        if early_stopping not in EARLY_STOPPING or not isinstance(early_stopping, (bool, str)):
            raise ValueError(f"early_stopping={early_stopping!r} is invalid; expected one of {EARLY_STOPPING}.")
        if length_penalty_type == "gnmt":
            penalty = lambda length: ((5.0 + length) / 6.0) ** alpha  # noqa: E731
        else:
            penalty = lambda length: length**alpha  # noqa: E731
        early_stopping = True if num_beams == 1 else early_stopping  # greedy search ends at its first </s>
        info = self.info
        pad, eos, start = info["pad_token_id"], info["eos_token_id"], info["decoder_start_token_id"]
        batch, beams = len(sources), num_beams
        width = max(map(len, sources))
        ids = np.full((batch, width), pad, dtype=np.int64)
        mask = np.zeros((batch, width), dtype=np.int64)
        for row, source in enumerate(sources):
            ids[row, : len(source)], mask[row, : len(source)] = source, 1
        cross = self.encoder.run(None, {"input_ids": ids, "attention_mask": mask})  # per layer: keys, values
        limits = mask.sum(1) + relative_max_length  # new tokens allowed per sentence (§6.1: input length + 50)
        longest = int(limits.max())  # generate()'s max_new_tokens for this batch

        # Every sentence's beams are consecutive rows; `active` holds the sentences still searching.
        rows = np.repeat(np.arange(batch), beams)
        cross, mask = [tensor[rows] for tensor in cross], mask[rows]
        heads = info["decoder_attention_heads"]
        past = [np.zeros((batch * beams, heads, 0, dim), dtype=cross[0].dtype) for dim in info["head_dims"]]
        past = past * info["decoder_layers"]
        cross_names, past_names, _ = cache_names(info["decoder_layers"])
        active = np.arange(batch)
        running = np.zeros((batch, beams), dtype=np.float32)
        running[:, 1:] = -1e9  # the first step expands one beam, as generate() does
        sequences = [[[] for _ in range(beams)] for _ in range(batch)]
        finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
        tokens = np.full((batch * beams, 1), start, dtype=np.int64)
        keep = 2 * beams
        step = 0
        while len(active):
            inputs = {"decoder_input_ids": tokens, "attention_mask": mask}
            inputs |= dict(zip(cross_names, cross, strict=True)) | dict(zip(past_names, past, strict=True))
            log_probs, *past = self.step.run(None, inputs)
            vocab = log_probs.shape[-1]
            scores = (running[active][:, :, None] + log_probs.reshape(len(active), beams, vocab)).reshape(
                len(active), -1
            )
            top = np.argpartition(-scores, keep - 1, axis=1)[:, :keep]
            top = np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), axis=1, kind="stable"), 1)
            step += 1
            next_rows, next_tokens, still = [], [], []
            for n, sentence in enumerate(active):
                candidates = [(scores[n, index], index // vocab, index % vocab) for index in top[n]]
                ends = [token == eos or step >= limits[sentence] for _, _, token in candidates]
                for rank, ((score, beam, token), end) in enumerate(zip(candidates, ends, strict=True)):
                    if end and rank < beams:
                        hypothesis = sequences[sentence][beam] + [int(token)]
                        finished[sentence].append((score / penalty(step), hypothesis))
                finished[sentence] = sorted(finished[sentence], key=lambda item: -item[0])[:beams]
                survivors = [c for c, end in zip(candidates, ends, strict=True) if not end][:beams]
                if len(finished[sentence]) >= beams:
                    if early_stopping is True or not survivors:
                        continue  # done: its beams leave the batch
                    length = longest if early_stopping == "never" and alpha > 0 else step
                    if survivors[0][0] / penalty(length) <= finished[sentence][-1][0]:
                        continue  # no running hypothesis can still beat the worst finished one
                sequences[sentence] = [sequences[sentence][beam] + [int(token)] for _, beam, token in survivors]
                running[sentence] = [score for score, _, _ in survivors]
                next_rows += [n * beams + beam for _, beam, _ in survivors]
                next_tokens += [token for _, _, token in survivors]
                still.append(n)
            if not still:
                break
            past = [tensor[next_rows] for tensor in past]  # each beam continues from the cache of the one it extends
            if len(still) < len(active):  # finished sentences leave the batch
                kept = np.repeat(np.asarray(still), beams) * beams + np.tile(np.arange(beams), len(still))
                cross, mask = [tensor[kept] for tensor in cross], mask[kept]
            tokens = np.asarray(next_tokens, dtype=np.int64)[:, None]
            active = active[still]
        return [max(hypotheses, key=lambda item: item[0])[1] for hypotheses in finished]
