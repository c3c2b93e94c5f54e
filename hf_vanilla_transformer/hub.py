"""Model cards filled from a run's results (and, with the sharing tools, Hub publishing)."""

from __future__ import annotations

from pathlib import Path


TEMPLATE = Path(__file__).with_name("model_card_template.md")

DATASET_IDS = {
    "libreoffice-help": ("libreoffice-help", "the LibreOffice help (Debian packages)"),
    "libreoffice-ui": ("libreoffice-ui", "the LibreOffice user-interface strings (Debian packages)"),
    "wmt14": ("wmt/wmt14", "WMT14"),
}


def _markdown_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_model_card(results: dict, repo_id: str | None = None, plots: list[str] | None = None) -> str:
    """The model card (README.md) of a trained model folder, from its `results.json` contents."""
    model, data, recipe = results["model"], results["data"], results["recipe"]
    test, training = results["test"], results["training"]
    dataset_id, dataset_name = DATASET_IDS.get(data["dataset"], (data["dataset"], data["dataset"]))
    examples = "\n".join(
        f"| {_markdown_escape(e['source'])} | {_markdown_escape(e['translation'])} | {_markdown_escape(e['reference'])} |"
        for e in results.get("examples", [])
    )
    if examples:
        examples = "| source | translation | reference |\n|---|---|---|\n" + examples
    accumulation = recipe.get("gradient_accumulation_steps", 1)
    values = {
        "source_lang": data["source_lang"],
        "target_lang": data["target_lang"],
        "license": data.get("license", "mpl-2.0"),
        "dataset_id": dataset_id,
        "dataset_name": dataset_name,
        "dataset_description": data.get("description", dataset_name),
        "model_name": results.get("name", "vanilla-transformer"),
        "bleu": round(test["bleu"], 2),
        "chrf": round(test["chrf"], 2),
        "tokenized_bleu": round(test.get("tokenized_bleu", float("nan")), 2),
        "bleu_signature": test["bleu_signature"],
        "chrf_signature": test["chrf_signature"],
        "test_pairs": test["pairs"],
        "test_beams": test["beams"],
        "train_pairs": data["train_pairs"],
        "validation_pairs": data["validation_pairs"],
        "encoder_layers": model["encoder_layers"],
        "decoder_layers": model["decoder_layers"],
        "d_model": model["d_model"],
        "heads": model["encoder_attention_heads"],
        "ffn_dim": model["encoder_ffn_dim"],
        "activation": model["activation_function"],
        "parameters": results["parameters"],
        "vocab_size": model["vocab_size"],
        "sinusoid_layout": model["sinusoid_layout"],
        "lr_scale": recipe["lr_scale"],
        "warmup": recipe["warmup_steps"],
        "label_smoothing": model["label_smoothing"],
        "dropout": model["dropout"],
        "max_tokens": recipe["max_tokens"],
        "accumulation": f", {accumulation} accumulated per update" if accumulation > 1 else "",
        "steps": training["steps"],
        "epochs": round(training["epochs"], 1),
        "train_minutes": round(training["seconds"] / 60, 1),
        "hardware": results.get("hardware", "unknown hardware"),
        "averaged": len(results.get("averaged_checkpoints", [])) or 1,
        "command": results.get("command", ""),
        "repo_id": repo_id or results.get("repo_id", "path/to/model"),
        "example_source": _markdown_escape(results["examples"][0]["source"]).replace('"', '\\"')
        if results.get("examples")
        else "Hello world.",
        "examples": examples,
        "plots": "\n\n".join(f"![{Path(p).stem}]({p})" for p in plots or []),
    }
    return TEMPLATE.read_text(encoding="utf-8").format(**values)


def write_model_card(folder: str | Path, results: dict, plots: list[str] | None = None) -> Path:
    path = Path(folder) / "README.md"
    path.write_text(render_model_card(results, plots=plots), encoding="utf-8")
    return path
