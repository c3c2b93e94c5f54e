"""Configuration of the original Transformer (Vaswani et al. 2017, "Attention Is All You Need").

The defaults are the paper's *base* model (§3, Table 3 row "base"); `VanillaTransformerConfig.from_preset("big")`
gives the *big* one. Field names follow Hugging Face's Marian so that every HF utility finds them
(`d_model`, `encoder_layers`, `encoder_attention_heads`, `encoder_ffn_dim`, ...).

Options beyond the paper are one field each and off by default:

* `pre_layer_norm`: pre-LN sub-layers `x + Dropout(Sublayer(LayerNorm(x)))` with a final LayerNorm on each stack
  (tensor2tensor's later default); the paper is post-LN `LayerNorm(x + Dropout(Sublayer(x)))`.
* `sinusoid_layout="concat"`: `[sin | cos]` halves (Marian) instead of the paper's interleaved `sin, cos, sin, cos,
  ...` (§3.5), with the paper's frequencies. `"fairseq"`: fairseq's (and FSMT's) sinusoids, `[sin | cos]` with the
  frequencies 10000^(-i / (d_model/2 - 1)) and positions counted from `pad_token_id + 1`.
* `position_embedding_type="learned"`: learned absolute positions (Table 3 row E), capped at
  `max_position_embeddings`. Sinusoids (the default) have no cap and are never stored in a checkpoint.
* `tie_word_embeddings=False`: an output projection of its own. Source and target embeddings stay one matrix (§3.4).
* `d_k` / `d_v`: per-head query/key and value sizes other than `d_model / heads` (§3.2.2).
* `source_vocab_size`: a source vocabulary and embedding of their own (fairseq's and FSMT's separate dictionaries);
  the target embedding stays shared with the output projection (`tie_word_embeddings`).
* `output_bias`: a bias on the output projection (Marian's `final_logits_bias`).

Special token ids other than fairseq's order (Marian: `</s>`=0, `<pad>`=decoder start=the last id; fairseq and
FSMT: decoding starts from `</s>`) are the four `*_token_id` fields. Converted models (`hf_vanilla_transformer.convert`)
set these fields; nothing else in the model knows where its weights came from.

Generation settings (beam size, length penalty, ...) live in the model's `GenerationConfig`, not here.
"""

from __future__ import annotations

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN


# The two sizes of the paper (§6.1, Table 3) and smaller ones for CPU runs, chosen by a budget's length: `medium`
# (small's depth, three quarters of base's width: an update 1.3x small's in bf16 on a 2-core Xeon with AMX; base's
# depth at the CPU recipe's peak learned a quarter as fast per update, docs/budget_curve.md), `small` and `compact`
# (1.5x small's speed); `tiny` for tests.
def symmetric_preset(d_model: int, layers: int, heads: int, ffn_dim: int, **more) -> dict:
    """A size with the same number of layers, heads and FFN width in the encoder and the decoder, as the paper's."""
    sides = {"layers": layers, "attention_heads": heads, "ffn_dim": ffn_dim}
    return dict(
        d_model=d_model, **{f"{side}_{key}": v for side in ("encoder", "decoder") for key, v in sides.items()}, **more
    )


PRESETS: dict[str, dict] = {
    "base": symmetric_preset(512, layers=6, heads=8, ffn_dim=2048, dropout=0.1),
    "big": symmetric_preset(1024, layers=6, heads=16, ffn_dim=4096, dropout=0.3),
    "medium": symmetric_preset(384, layers=3, heads=6, ffn_dim=1536, dropout=0.1),
    "small": symmetric_preset(256, layers=3, heads=4, ffn_dim=1024, dropout=0.1),
    "compact": symmetric_preset(192, layers=3, heads=4, ffn_dim=768, dropout=0.1),
    "tiny": symmetric_preset(32, layers=2, heads=4, ffn_dim=64, dropout=0.1, vocab_size=99),
}

POSITION_EMBEDDING_TYPES = ("sinusoidal", "learned")
INITIALIZATIONS = ("xavier", "normal")
SINUSOID_LAYOUTS = ("interleaved", "concat", "fairseq")


class VanillaTransformerConfig(PreTrainedConfig):
    r"""
    Configuration of [`VanillaTransformerModel`] and [`VanillaTransformerForConditionalGeneration`].

    Args:
        vocab_size (`int`, *optional*, defaults to 37000):
            Size of the one vocabulary shared by source and target (§5.1: about 37,000 BPE tokens for EN-DE).
        d_model (`int`, *optional*, defaults to 512):
            Width of every sub-layer output and of the embeddings (§3.1).
        encoder_layers (`int`, *optional*, defaults to 6):
            Number of encoder layers N (§3.1).
        decoder_layers (`int`, *optional*, defaults to 6):
            Number of decoder layers N (§3.1).
        encoder_attention_heads (`int`, *optional*, defaults to 8):
            Heads h of encoder self-attention (§3.2.2).
        decoder_attention_heads (`int`, *optional*, defaults to 8):
            Heads h of decoder self- and cross-attention (§3.2.2).
        encoder_ffn_dim (`int`, *optional*, defaults to 2048):
            Inner size d_ff of the encoder's position-wise feed-forward networks (§3.3).
        decoder_ffn_dim (`int`, *optional*, defaults to 2048):
            Inner size d_ff of the decoder's position-wise feed-forward networks (§3.3).
        d_k (`int`, *optional*):
            Per-head size of queries and keys; `None` means `d_model / heads` (§3.2.2).
        d_v (`int`, *optional*):
            Per-head size of values; `None` means `d_model / heads` (§3.2.2).
        dropout (`float`, *optional*, defaults to 0.1):
            P_drop, applied to every sub-layer output before the residual add and to embeddings + positions (§5.4).
        attention_dropout (`float`, *optional*, defaults to 0.0):
            Dropout on attention probabilities (not in the paper).
        activation_dropout (`float`, *optional*, defaults to 0.0):
            Dropout after the FFN activation (not in the paper).
        activation_function (`str`, *optional*, defaults to `"relu"`):
            FFN activation; the paper's is ReLU (§3.3).
        scale_embedding (`bool`, *optional*, defaults to `True`):
            Multiply embedding outputs by sqrt(d_model) (§3.4).
        tie_word_embeddings (`bool`, *optional*, defaults to `True`):
            Share the pre-softmax projection with the (already shared) source/target embedding (§3.4); with
            `source_vocab_size`, with the target embedding.
        source_vocab_size (`int`, *optional*):
            `None` (the paper): one vocabulary and one embedding matrix for source and target (§3.4). An integer: the
            encoder has a vocabulary of this size and an embedding of its own (fairseq's separate dictionaries);
            `vocab_size` is then the target's.
        output_bias (`bool`, *optional*, defaults to `False`):
            A bias on the output projection, logits = x E^T + b (Marian's `final_logits_bias`); the paper has none.
        layer_norm_eps (`float`, *optional*, defaults to 1e-5):
            Epsilon of every LayerNorm.
        label_smoothing (`float`, *optional*, defaults to 0.1):
            epsilon_ls of the training loss (§5.4).
        pre_layer_norm (`bool`, *optional*, defaults to `False`):
            Pre-LN sub-layers with a final LayerNorm per stack instead of the paper's post-LN.
        position_embedding_type (`str`, *optional*, defaults to `"sinusoidal"`):
            `"sinusoidal"` (§3.5, computed for any length) or `"learned"` (Table 3 row E).
        sinusoid_layout (`str`, *optional*, defaults to `"interleaved"`):
            `"interleaved"` (the paper: sin at even features, cos at odd), `"concat"` (`[sin | cos]`, Marian) or
            `"fairseq"` (`[sin | cos]`, frequencies 10000^(-i / (d_model/2 - 1)), positions from pad_token_id + 1).
        max_position_embeddings (`int`, *optional*):
            Longest sequence with learned positions; required by them. Sinusoidal positions have no limit and
            leave it `None`.
        initialization (`str`, *optional*, defaults to `"normal"`):
            How new weights are drawn (the paper does not say). `"normal"`: every projection and the embedding
            N(0, init_std), as transformers' models (Marian, BART) draw them; measured to learn faster than
            `"xavier"` at every size tried (docs/cpu_recipe.md). `"xavier"`: as the reference implementations
            (tensor2tensor, fairseq): embeddings N(0, d_model^-0.5), projections Xavier-uniform. Loading saved
            weights is unaffected.
        init_std (`float`, *optional*):
            Standard deviation of the normal draws; `None` means d_model^-0.5 for `"xavier"` (the embedding) and
            0.02 for `"normal"`.
        use_cache (`bool`, *optional*, defaults to `True`):
            Return the encoder-decoder key/value cache.
        pad_token_id, bos_token_id, eos_token_id, decoder_start_token_id (`int`, *optional*, defaults to 1, 0, 2, 0):
            Special tokens, in fairseq's layout (`<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3). Decoding starts from
            `decoder_start_token_id` (the tokenizer's `<s>`).
    """

    model_type = "vanilla_transformer"
    keys_to_ignore_at_inference = ["cache"]
    # Generic names read by HF utilities. The key/value cache that generate() builds is the decoder's, so the layer
    # and head counts are the decoder's.
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "decoder_attention_heads",
        "num_hidden_layers": "decoder_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    d_k: int | None = None
    d_v: int | None = None
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation_function: str = "relu"
    scale_embedding: bool = True
    tie_word_embeddings: bool = True
    source_vocab_size: int | None = None
    output_bias: bool = False
    layer_norm_eps: float = 1e-5
    label_smoothing: float = 0.1
    pre_layer_norm: bool = False
    position_embedding_type: str = "sinusoidal"
    sinusoid_layout: str = "interleaved"
    max_position_embeddings: int | None = None
    initialization: str = "normal"
    init_std: float | None = None
    use_cache: bool = True
    is_encoder_decoder: bool = True
    # fairseq's layout: <s>=0, <pad>=1, </s>=2, <unk>=3. A padding id of 0 would make transformers' beam search
    # fill finished rows with </s> instead of <pad> (it tests `pad_token_id or eos_token_id`).
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | None = 2
    decoder_start_token_id: int | None = 0

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self._check_values()

    @classmethod
    def from_preset(cls, name: str, **overrides) -> VanillaTransformerConfig:
        """A config for one of the named sizes (`base`, `big`, `medium`, `small`, `compact`, `tiny`), with `overrides`
        on top."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; expected one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **overrides})

    def encoder_vocab_size(self) -> int:
        """The source vocabulary's size: `source_vocab_size` where the source has its own, else `vocab_size`."""
        return self.source_vocab_size if self.source_vocab_size is not None else self.vocab_size

    def head_dims(self, heads: int) -> tuple[int, int]:
        """(d_k, d_v) for a block with `heads` heads: the configured sizes, else d_model / heads (§3.2.2)."""
        return (self.d_k or self.d_model // heads, self.d_v or self.d_model // heads)

    def _check_values(self) -> None:
        """Raise a `ValueError` naming the first impossible value."""
        self._check_sizes()
        self._check_options()

    def _fail(self, name: str, expected: str) -> None:
        raise ValueError(f"VanillaTransformerConfig: {name}={getattr(self, name)!r} is invalid; expected {expected}.")

    def _check_sizes(self) -> None:
        """The widths, depths and heads (§3), and the special token ids."""
        for name in (
            "vocab_size",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
        ):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                self._fail(name, "a positive integer")
        for name in ("d_k", "d_v"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                self._fail(name, "None (d_model / heads) or a positive integer")
        if self.source_vocab_size is not None and (not _is_int(self.source_vocab_size) or self.source_vocab_size < 1):
            self._fail("source_vocab_size", "None (one vocabulary for source and target) or a positive integer")
        for heads in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.d_model % getattr(self, heads) and (self.d_k is None or self.d_v is None):
                self._fail(heads, f"a divisor of d_model={self.d_model}, or d_k and d_v set explicitly")
        learned = self.position_embedding_type == "learned"
        if (learned or self.max_position_embeddings is not None) and (
            not _is_int(self.max_position_embeddings) or self.max_position_embeddings < 1
        ):
            self._fail("max_position_embeddings", "a positive integer (learned positions need one)")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value < self.vocab_size):
                self._fail(name, f"None or a token id in [0, vocab_size={self.vocab_size})")
        if self.decoder_start_token_id is None:
            self._fail("decoder_start_token_id", "a token id: the decoder needs a first input")

    def _check_options(self) -> None:
        """Probabilities, the activation, the epsilon, the initialization and the switches beyond the paper."""
        for name in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value < 1.0:
                self._fail(name, "a probability in [0, 1)")
        if self.activation_function not in ACT2FN:
            self._fail("activation_function", "one of transformers' activations, e.g. 'relu' or 'gelu'")
        if not _is_number(self.layer_norm_eps) or not self.layer_norm_eps > 0:
            self._fail("layer_norm_eps", "a positive number")
        if self.init_std is not None and (not _is_number(self.init_std) or not self.init_std > 0):
            self._fail("init_std", "None (the scheme's default) or a positive number")
        if self.initialization not in INITIALIZATIONS:
            self._fail("initialization", f"one of {INITIALIZATIONS}")
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            self._fail("position_embedding_type", f"one of {POSITION_EMBEDDING_TYPES}")
        if self.sinusoid_layout not in SINUSOID_LAYOUTS:
            self._fail("sinusoid_layout", f"one of {SINUSOID_LAYOUTS}")
        if self.sinusoid_layout == "fairseq" and (self.d_model < 4 or self.d_model % 2 or self.pad_token_id is None):
            self._fail(
                "sinusoid_layout", "'fairseq' only with an even d_model >= 4 and a pad_token_id (where it counts from)"
            )
        for name in ("scale_embedding", "tie_word_embeddings", "pre_layer_norm", "output_bias"):
            if not isinstance(getattr(self, name), bool):
                self._fail(name, "True or False")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


__all__ = ["PRESETS", "VanillaTransformerConfig"]
