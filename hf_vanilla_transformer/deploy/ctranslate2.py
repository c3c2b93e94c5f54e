"""Export a trained model folder to CTranslate2, the inference engine people translate with at volume.

The model maps onto CTranslate2's `TransformerSpec` weight for weight: post-LN layers (`pre_norm=False`, no final
LayerNorm; pre-LN models get CTranslate2's pre-norm layers and final LayerNorms), ReLU (or GELU), embeddings scaled by
sqrt(d_model), the fused query/key/value projection of self-attention and the fused key/value projection of
encoder-decoder attention, the LayerNorm epsilon, and one matrix for both embeddings and the output projection.
CTranslate2's own sinusoids have another layout, so this model's positions (the paper's interleaved table, or the
learned ones) are written out as a table of `max_positions` rows; a longer input is refused. Sources get `</s>`
appended by CTranslate2 (`add_source_eos`), as this package's tokenizer does; decoding starts from `<s>`.

`ctranslate2` is an optional dependency (`pip install hf_vanilla_transformer[deploy]`), imported when used.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..data.batching import inference_batches
from ..data.tokenizer import copy_tokenizer_files
from ..data.translation_bounds import TRANSLATION_MAX_TOKENS, encode_within
from ..model.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    sinusoidal_positions,
    token_positions,
)
from .rules import EXPORT_INFO, check_positions, decoding_arguments, recorded_decoding


QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16", "bfloat16")
ACTIVATIONS = {
    **{"relu": "RELU", "gelu": "GELU", "gelu_new": "GELUTanh", "gelu_pytorch_tanh": "GELUTanh"},
    **{"swish": "SWISH", "silu": "SWISH"},  # Marian's (converted opus-mt models)
}


def ctranslate2_spec(model: VanillaTransformerForConditionalGeneration, tokens: list[str], max_positions: int):
    """CTranslate2's `TransformerSpec` holding `model`'s weights, with `tokens` (the vocabulary in id order) as both
    source and target vocabulary. Raises ValueError naming what CTranslate2 cannot express."""
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    head_dim, value_head_dim = config.head_dims(config.encoder_attention_heads)
    if (head_dim, value_head_dim) != config.head_dims(config.decoder_attention_heads) or head_dim != value_head_dim:
        raise ValueError(
            f"d_k={config.d_k}, d_v={config.d_v} with {config.encoder_attention_heads}/{config.decoder_attention_heads}"
            " heads: CTranslate2 needs one head size for queries, keys and values in both stacks."
        )
    if config.activation_function not in ACTIVATIONS:
        raise ValueError(
            f"activation_function={config.activation_function!r} has no CTranslate2 equivalent; expected one of "
            f"{sorted(ACTIVATIONS)}."
        )
    if config.source_vocab_size is not None:
        raise ValueError(
            f"source_vocab_size={config.source_vocab_size}: a source vocabulary of its own (a converted FSMT or fairseq "
            "model with separate dictionaries) is not exported to CTranslate2; models with one vocabulary are."
        )
    if len(tokens) != config.vocab_size:
        raise ValueError(f"The tokenizer has {len(tokens)} tokens; the model's vocab_size is {config.vocab_size}.")
    activation = getattr(common_spec.Activation, ACTIVATIONS[config.activation_function])
    shape = dict(pre_norm=config.pre_layer_norm, activation=activation, head_dim=head_dim)
    encoder = transformer_spec.TransformerEncoderSpec(config.encoder_layers, config.encoder_attention_heads, **shape)
    decoder = transformer_spec.TransformerDecoderSpec(config.decoder_layers, config.decoder_attention_heads, **shape)
    spec = transformer_spec.TransformerSpec(encoder, decoder)

    positions = position_table(model, max_positions)
    shared = model.model.shared.weight
    _set_stack(encoder, model.model.encoder, shared, positions, config, cross_attention=False)
    _set_stack(decoder, model.model.decoder, shared, positions, config, cross_attention=True)
    _set_linear(decoder.projection, model.lm_head)  # the shared matrix unless the config unties it; a converted bias

    spec.config.layer_norm_epsilon = config.layer_norm_eps
    spec.config.add_source_eos = True
    spec.config.eos_token = tokens[config.eos_token_id]
    if config.bos_token_id is not None:  # Marian's vocabulary has no <s>
        spec.config.bos_token = tokens[config.bos_token_id]
    spec.config.decoder_start_token = tokens[config.decoder_start_token_id]
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    return spec


def position_table(model: VanillaTransformerForConditionalGeneration, max_positions: int) -> torch.Tensor:
    """Rows 0 .. max_positions - 1 of the model's position encodings: the sinusoids in its layout, or the learned
    table (which must have that many rows)."""
    config = model.config
    if config.position_embedding_type == "learned":
        if max_positions > config.max_position_embeddings:
            raise ValueError(
                f"max_positions={max_positions}, but the learned positions have {config.max_position_embeddings} rows."
            )
        return model.model.encoder.embed_positions.weight[:max_positions].detach()
    positions = token_positions(config, max_positions, 0, "cpu")  # fairseq's start at padding id + 1
    return sinusoidal_positions(positions, config.d_model, config.sinusoid_layout)


def _array(tensor: torch.Tensor):
    return tensor.detach().float().cpu().numpy()


def _set_linear(spec, module: torch.nn.Linear) -> None:
    spec.weight = _array(module.weight)
    if module.bias is not None:
        spec.bias = _array(module.bias)


def _set_fused(spec, modules: list[torch.nn.Linear]) -> None:
    """One linear spec for several projections of the same input, their outputs concatenated."""
    spec.weight = _array(torch.cat([module.weight for module in modules]))
    spec.bias = _array(torch.cat([module.bias for module in modules]))


def _set_norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _set_stack(spec, stack, shared, positions, config, cross_attention: bool) -> None:
    spec.scale_embeddings = math.sqrt(config.d_model) if config.scale_embedding else 1.0
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _array(shared)
    spec.position_encodings.encodings = _array(positions)
    if stack.layer_norm is not None:  # pre-LN only
        _set_norm(spec.layer_norm, stack.layer_norm)
    for layer_spec, layer in zip(spec.layer, stack.layers, strict=True):
        attention = layer.self_attn
        _set_fused(layer_spec.self_attention.linear[0], [attention.q_proj, attention.k_proj, attention.v_proj])
        _set_linear(layer_spec.self_attention.linear[1], attention.out_proj)
        _set_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        if cross_attention:
            cross = layer.encoder_attn
            _set_linear(layer_spec.attention.linear[0], cross.q_proj)
            _set_fused(layer_spec.attention.linear[1], [cross.k_proj, cross.v_proj])
            _set_linear(layer_spec.attention.linear[2], cross.out_proj)
            _set_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
        _set_linear(layer_spec.ffn.linear_0, layer.ffn.fc1)
        _set_linear(layer_spec.ffn.linear_1, layer.ffn.fc2)
        _set_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)


def export_ctranslate2(
    model_dir: str | Path, output_dir: str | Path, quantization: str = "float32", max_positions: int = 1024
) -> Path:
    """Convert the model folder `model_dir` (with its tokenizer) into a CTranslate2 folder `output_dir`: model.bin,
    the shared vocabulary, the tokenizer files, `EXPORT_INFO` and a README saying how to translate with it."""
    from transformers import AutoTokenizer

    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r} is invalid; expected one of {QUANTIZATIONS}.")
    if max_positions < 2:
        raise ValueError(f"max_positions={max_positions} is invalid; expected at least 2.")
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir} holds no config.json; expected a model folder saved by this package.")
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    spec = ctranslate2_spec(model, tokens, max_positions)
    spec.validate()
    spec.optimize(quantization=quantization)
    output_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(output_dir))
    copy_tokenizer_files(model_dir, output_dir)
    info = {
        "format": "ctranslate2",
        "quantization": quantization,
        "max_positions": max_positions,
        "max_source_tokens": max_positions - 1,  # the appended </s> takes one position
        "generation": model.generation_config.to_diff_dict(),
        "decoding": decoding_defaults(model.generation_config.to_diff_dict()),
        "source": Path(model_dir).resolve().name,  # the model folder by its name: no local path is recorded
    }
    (output_dir / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    (output_dir / "README.md").write_text(_readme(info), encoding="utf-8")
    return output_dir


# The target length (tokens) at which CTranslate2's length penalty is matched to GNMT's: about the mean of the
# LibreOffice help test split (18.6 tokens a sentence) and of sentence-level translation generally.
TYPICAL_TARGET_TOKENS = 20


def ctranslate2_alpha(alpha: float, penalty_type: str = "gnmt", length: int = TYPICAL_TARGET_TOKENS) -> float:
    """CTranslate2's length-penalty α that ranks hypotheses of about `length` tokens as the model's penalty does.

    CTranslate2 divides a hypothesis's log-probability by L^α'; GNMT (§6.1, this model's `generate()`) by
    ((5 + L) / 6)^α. Their log-penalties grow by α' / L and α / (5 + L) per token, which are equal at length L for
    α' = α L / (5 + L): 0.8 α at 20 tokens. Measured (docs/deploy.md): GNMT α 1.5 → α' 1.2 gave BLEU within 0.03 of
    the model's own beam search (α' 1.5: 0.41 below it). transformers' own penalty (`"hf"`) is CTranslate2's rule.
    """
    if penalty_type != "gnmt":
        return float(alpha)
    return round(alpha * length / (5 + length), 4)


def decoding_defaults(generation: dict) -> dict:
    """The model's decoding from its generation config (as `to_diff_dict()` gives it, so that exports written before
    this field read the same): beams, the length penalty α (the one the main job chose on the validation split, else
    the paper's 0.6) as CTranslate2's α (`ctranslate2_alpha`), and the relative length limit."""
    from transformers import GenerationConfig

    rules = recorded_decoding(GenerationConfig.from_dict(dict(generation)))  # as generate() reads them
    alpha, penalty_type = rules["length_penalty"], rules["length_penalty_type"]
    defaults = {
        "num_beams": rules["num_beams"],
        "length_penalty": ctranslate2_alpha(alpha, penalty_type),
        "model_length_penalty": {"alpha": alpha, "type": penalty_type},
        "relative_max_length": rules["relative_max_length"],
    }
    if rules["relative_max_length"] is None:  # a converted model's absolute limit (tokens, the start one included)
        defaults["max_length"] = generation.get("max_length")
    return defaults


def _readme(info: dict) -> str:
    decoding = info["decoding"]
    return f"""# A Vanilla Transformer for CTranslate2

Converted by `hf_vanilla_transformer` (`scripts/export.py --to ctranslate2`, quantization {info["quantization"]}).
Sources of at most {info["max_source_tokens"]} tokens (the position table has {info["max_positions"]} rows).

```python
import os

import ctranslate2
from transformers import AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER")
# One worker per core, one thread each: batches translate in parallel (on 2 cores, 1.9-2.5x the sentences/s of one
# worker with 2 threads for a list of sentences; the same translations).
translator = ctranslate2.Translator("THIS_FOLDER", device="cpu", inter_threads=os.cpu_count() or 1, intra_threads=1)
sources = [tokenizer.tokenize(s) for s in ["Choose Format - Cells."]]  # </s> is appended by CTranslate2
results = translator.translate_batch(
    sources, beam_size={decoding["num_beams"]}, length_penalty={decoding["length_penalty"]}, max_decoding_length=256
)
print([tokenizer.convert_tokens_to_string(r.hypotheses[0]) for r in results])
```

CTranslate2 normalises beam scores by length^alpha, not by GNMT's ((5 + length) / 6)^alpha as this model's
`generate()` does; greedy decoding (`beam_size=1`) gives the same tokens as `generate(num_beams=1)`. The α above is
the model's own ({decoding["model_length_penalty"]["type"]} α {decoding["model_length_penalty"]["alpha"]}, from its
generation config) carried over to CTranslate2's rule: the α that penalises a 20-token translation's growth as the
model's rule does (docs/deploy.md).
Or with the package: `python scripts/translate.py THIS_FOLDER --engine ctranslate2 < input.txt`.
"""


class CTranslate2Translator:
    """A CTranslate2 folder written by `export_ctranslate2`, translating lists of sentences like `translate()`."""

    def __init__(self, folder: str | Path, device: str = "cpu", threads: int = 0, workers: int | None = None):
        """`threads`: CPU threads in all (0: as many as PyTorch uses). `workers`: batches translated at once, each
        with `threads // workers` threads; None: on a CPU one worker per thread (the fastest for a list of sentences:
        on 2 cores, 2 workers of 1 thread translated 1.9-2.5x the sentences per second of 1 worker of 2 threads,
        docs/deploy.md), on a GPU one."""
        import ctranslate2
        from transformers import AutoTokenizer

        folder = Path(folder)
        info_file = folder / EXPORT_INFO
        if not info_file.exists():
            raise FileNotFoundError(f"{folder} holds no {EXPORT_INFO}; expected a folder written by scripts/export.py.")
        self.info = json.loads(info_file.read_text(encoding="utf-8"))
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        threads = threads or torch.get_num_threads()
        if workers is None:
            workers = threads if device == "cpu" else 1
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1 or workers > threads:
            raise ValueError(
                f"workers={workers!r} is invalid; expected an integer from 1 to threads={threads} (batches translated "
                "at once, each with at least one thread)."
            )
        self.workers, self.threads_per_worker = workers, threads // workers
        self.translator = ctranslate2.Translator(
            str(folder), device=device, inter_threads=workers, intra_threads=self.threads_per_worker
        )
        # The model's decoding: beams, α and the length limit of its generation config, recorded by the export.
        self.defaults = self.info.get("decoding") or decoding_defaults(self.info.get("generation", {}))

    def tokens(self, sentences: list[str]) -> list[list[str]]:
        """Source tokens without the `</s>` (CTranslate2 appends it)."""
        return [
            self.tokenizer.convert_ids_to_tokens(self.tokenizer(s, add_special_tokens=False)["input_ids"])
            for s in sentences
        ]

    def translate(
        self,
        sentences: list[str],
        num_beams: int | None = None,
        length_penalty: float | None = None,
        relative_max_length: int | None = None,
        max_batch_size: int = 32,
        max_tokens: int = TRANSLATION_MAX_TOKENS,
    ) -> list[str]:
        """Translations in input order, empty sentences kept empty; at most source length + `relative_max_length`
        tokens each, as the model's §6.1 rule (CTranslate2 caps a batch at its longest source's limit). Beams, α and
        the length limit default to the model's (`self.defaults`). The bounds of `translate()`: batches of at most
        `max_tokens` padded source tokens (`</s>` included) and `max_batch_size` sentences, a longer line refused in
        one line naming it (data/translation_bounds.py), as is one longer than the export's position table."""
        num_beams, length_penalty, relative_max_length = decoding_arguments(
            self.defaults, num_beams, length_penalty, relative_max_length, max_batch_size
        )
        texts = [i for i, sentence in enumerate(sentences) if sentence.strip()]
        outputs = [""] * len(sentences)
        sources = encode_within(self.tokens, sentences, texts, max_tokens, appended=1)
        limit, positions = self.info["max_source_tokens"], self.info["max_positions"]
        table = f"this export's {limit} (max_positions {positions}); export again with a larger --max_positions"
        check_positions([len(source) for source in sources], texts, limit, table)
        # Fewer sentences than workers x max_batch_size: smaller batches, so that every worker has one. Each batch
        # is queued at once (asynchronous): the workers translate them side by side.
        per_batch = min(max_batch_size, math.ceil(len(sources) / self.workers)) if sources else max_batch_size
        batches = inference_batches([len(source) + 1 for source in sources], max_tokens, per_batch)
        pending = [
            self.translator.translate_batch(
                [sources[i] for i in batch],
                beam_size=num_beams,
                length_penalty=length_penalty if num_beams > 1 else 0.0,
                max_decoding_length=self._decoding_limit([sources[i] for i in batch], relative_max_length),
                max_input_length=0,  # never cut short: the sources were bounded above
                asynchronous=True,
            )
            for batch in batches
        ]
        for batch, results in zip(batches, pending, strict=True):
            for index, result in zip(batch, results, strict=True):
                ids = self.tokenizer.convert_tokens_to_ids(result.result().hypotheses[0])
                outputs[texts[index]] = self.tokenizer.decode(ids, skip_special_tokens=True).strip()
        return outputs

    def _decoding_limit(self, sources: list[list[str]], relative_max_length: int | None) -> int:
        """Tokens CTranslate2 may generate (its `</s>` included): the longest source + 1 + the relative limit (§6.1),
        or a converted model's absolute `max_length` (which counts the start token too)."""
        if relative_max_length is not None:
            return max(len(s) for s in sources) + 1 + relative_max_length
        return (self.defaults.get("max_length") or 512) - 1
