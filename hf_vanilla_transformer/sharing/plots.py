"""Pictures of a trained model: training curves, attention maps, the positional-encoding matrix (matplotlib).

The training run writes them into `MODEL_DIR/plots/` and the model card shows them; `scripts/plot_attention.py`
draws the attention maps of any sentence. Every function writes one PNG and returns its path.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..utils.faults import moment


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path: str | Path, dpi: int = 110) -> Path:
    """Write `figure` to `path` (its folder created) and free it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    _pyplot().close(figure)
    return path


def _series(log_history: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(entry["step"], entry[key]) for entry in log_history if key in entry and "step" in entry]
    return [step for step, _ in points], [float(value) for _, value in points]


def plot_training_curves(log_history: list[dict], path: str | Path) -> Path:
    """Training loss, learning rate and (where the run evaluated) validation BLEU and loss over updates.

    `log_history` is `Trainer.state.log_history` (also in a run's `training_log.json`).
    """
    if not any("loss" in entry for entry in log_history):
        raise ValueError("log_history holds no training loss; was anything logged (logging_steps)?")
    plt = _pyplot()
    panels = [("loss", "training loss"), ("learning_rate", "learning rate")]
    if any("eval_bleu" in entry for entry in log_history):
        panels.append(("eval_bleu", "validation BLEU (greedy)"))
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), constrained_layout=True)
    for axis, (key, title) in zip(axes, panels, strict=True):
        steps, values = _series(log_history, key)
        axis.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=title)
        if key == "loss":
            eval_steps, eval_loss = _series(log_history, "eval_loss")
            if eval_steps:
                axis.plot(eval_steps, eval_loss, marker="o", markersize=3, label="validation loss")
                axis.legend()
        axis.set_title(title)
        axis.set_xlabel("update")
        axis.grid(alpha=0.3)
    return _save(figure, path)


def plot_positional_encoding(d_model: int, path: str | Path, length: int = 128, layout: str = "interleaved") -> Path:
    """The sinusoidal position matrix of §3.5 (positions × dimensions) as the model computes it."""
    from ..model.modeling_vanilla_transformer import sinusoidal_positions

    matrix = sinusoidal_positions(torch.arange(length), d_model, layout).numpy()
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8, 4.2), constrained_layout=True)
    image = axis.imshow(matrix, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, interpolation="nearest")
    axis.set_xlabel(f"dimension (layout: {layout})")
    axis.set_ylabel("position")
    axis.set_title(f"sinusoidal positional encoding, d_model {d_model}")
    figure.colorbar(image, ax=axis)
    return _save(figure, path)


@torch.no_grad()
def attention_maps(model, tokenizer, sentence: str, translation: str | None = None) -> dict:
    """Attention weights of every layer and head for `sentence` and its translation (the model's own, by default).

    Returns {"source_tokens", "target_tokens", "decoder_input_tokens", "translation", "encoder", "decoder", "cross"}:
    one readable label per token of the source, of the target and of the decoder's input (the target shifted right:
    the queries of the decoder and cross maps); the translation as text, special tokens left out; and each attention
    entry a float tensor (layers, heads, queries, keys). The weights come from the eager attention, whatever the
    model uses.
    """
    if not isinstance(sentence, str) or not sentence.strip():
        raise ValueError(f"sentence={sentence!r}: expected a non-empty string.")
    model.eval()
    device = next(model.parameters()).device
    inputs = tokenizer([sentence], return_tensors="pt").to(device)
    if translation is None:
        output_ids = model.generate(**inputs)[0]
    else:
        labels = tokenizer(text_target=[translation])["input_ids"][0]
        output_ids = torch.tensor([model.config.decoder_start_token_id, *labels], device=device)
    # The decoder reads everything but the last token; its queries are the positions that predicted the next one.
    output_ids = output_ids[output_ids != model.config.pad_token_id]
    if len(output_ids) > 1:
        decoder_ids, target_ids = output_ids[:-1], output_ids[1:]
    else:
        decoder_ids = target_ids = output_ids
    decoder_input_ids = decoder_ids[None]
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        outputs = model(**inputs, decoder_input_ids=decoder_input_ids, output_attentions=True)
    finally:
        model.set_attn_implementation(previous)

    def stack(layers):
        return torch.stack([layer[0].float().cpu() for layer in layers])

    def readable(ids) -> list[str]:
        # One label per token, as text (byte-level BPE tokens are bytes, so "für" would show as "fÃ¼r"); a token
        # that starts a word gets "▁", and special tokens keep their names.
        return [tokenizer.decode([i]).replace(" ", "▁") or tokenizer.convert_ids_to_tokens(i) for i in ids]

    return {
        "source_tokens": readable(inputs["input_ids"][0].tolist()),
        "target_tokens": readable(target_ids.tolist()),
        "decoder_input_tokens": readable(decoder_ids.tolist()),
        "translation": tokenizer.decode(output_ids, skip_special_tokens=True),
        "encoder": stack(outputs.encoder_attentions),
        "decoder": stack(outputs.decoder_attentions),
        "cross": stack(outputs.cross_attentions),
    }


def plot_attention_grid(
    weights: torch.Tensor, query_tokens: list[str], key_tokens: list[str], title: str, path: str | Path
) -> Path:
    """One heat map per layer (rows) and head (columns) of `weights` (layers, heads, queries, keys)."""
    layers, heads = weights.shape[:2]
    plt = _pyplot()
    cell = max(1.8, min(3.2, 0.12 * max(len(query_tokens), len(key_tokens))))
    figure, axes = plt.subplots(
        layers, heads, figsize=(cell * heads + 1, cell * layers + 0.8), squeeze=False, constrained_layout=True
    )
    labelled = max(len(query_tokens), len(key_tokens)) <= 40
    for layer in range(layers):
        for head in range(heads):
            axis = axes[layer][head]
            axis.imshow(weights[layer, head].numpy(), cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
            axis.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
            if labelled and head == 0:
                axis.set_yticks(range(len(query_tokens)), query_tokens, fontsize=5)
            else:
                axis.set_yticks([])
            if labelled and layer == layers - 1:
                axis.set_xticks(range(len(key_tokens)), key_tokens, fontsize=5, rotation=90)
            else:
                axis.set_xticks([])
    figure.suptitle(title)
    return _save(figure, path, dpi=100)


def attention_map_panels(config) -> int:
    """The panels of the largest of a model's three attention maps (`plot_attention_maps`): its layers times its
    heads, in the encoder or the decoder."""
    encoder = config.encoder_layers * config.encoder_attention_heads
    return max(encoder, config.decoder_layers * config.decoder_attention_heads)


def plot_attention(model, tokenizer, sentence: str, folder: str | Path, translation: str | None = None) -> list[Path]:
    """Encoder self-attention, decoder self-attention and cross-attention maps of `sentence`: three PNGs."""
    return plot_attention_maps(attention_maps(model, tokenizer, sentence, translation), folder)


def plot_attention_maps(maps: dict, folder: str | Path) -> list[Path]:
    """The three PNGs of `attention_maps`' result."""
    folder = Path(folder)
    source, queries = maps["source_tokens"], maps["decoder_input_tokens"]
    return [
        plot_attention_grid(
            maps["encoder"], source, source, "encoder self-attention", folder / "attention_encoder.png"
        ),
        plot_attention_grid(
            maps["decoder"], queries, queries, "decoder self-attention (masked)", folder / "attention_decoder.png"
        ),
        plot_attention_grid(
            maps["cross"], queries, source, "encoder-decoder (cross) attention", folder / "attention_cross.png"
        ),
    ]


def write_run_plots(model, tokenizer, log_history: list[dict], folder: str | Path, sentence: str | None) -> list[Path]:
    """Every picture of a training run, into `folder`: curves, positional encoding, attention maps of `sentence`
    (none where it is None: a sentence of the user's own data stays private)."""
    folder = Path(folder)
    paths = []
    if any("loss" in entry for entry in log_history):
        paths.append(plot_training_curves(log_history, folder / "training_curves.png"))
    moment("plots")
    paths.append(
        plot_positional_encoding(
            model.config.d_model, folder / "positional_encoding.png", layout=model.config.sinusoid_layout
        )
    )
    if sentence is not None:
        paths.extend(plot_attention(model, tokenizer, sentence, folder))
    return paths
