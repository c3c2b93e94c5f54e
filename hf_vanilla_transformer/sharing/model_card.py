"""The model card (a model folder's README.md) filled from the run's `results.json`, with the template
`model_card.md` beside this file (the repository's top-level `model_card.md` is a link to it)."""

from __future__ import annotations

from pathlib import Path

from ..utils.files import write_text_atomically
from ..utils.redact import public_command


TEMPLATE = Path(__file__).with_name("model_card.md")

DATASET_IDS = {
    "libreoffice-help": ("libreoffice-help", "the LibreOffice help (Debian packages)"),
    "libreoffice-ui": ("libreoffice-ui", "the LibreOffice user-interface strings (Debian packages)"),
    "libreoffice-help-ui": ("libreoffice-help-ui", "the LibreOffice help and user-interface strings (Debian packages)"),
    "debian-messages": ("debian-messages", "the messages of command-line tools (Debian packages' gettext catalogues)"),
    "wmt14": ("wmt/wmt14", "WMT14"),
}
# What the test split is, and what its figures compare with.
TEST_SPLITS = {
    "libreoffice-help": ", split by file so that no test page was seen in training",
    "libreoffice-ui": ", split by message (a hash of its English text) so that no test message was seen in training",
    "libreoffice-help-ui": (
        ", the help's own, split by file so that no test page was seen in training; no UI string trained on is a test"
        " sentence"
    ),
    "debian-messages": ", split by message (a hash of its English text) so that no test message was seen in training",
    "wmt14": ": newstest2014, the paper's test set",
}
COMPARABILITY = {
    "libreoffice-help": "The domain is software documentation: these figures are not comparable with newstest2014.",
    "libreoffice-ui": "The domain is software user interfaces: these figures are not comparable with newstest2014.",
    "debian-messages": "The domain is command-line tools' messages: these figures are not comparable with newstest2014.",
    "wmt14": (
        "Tokenized BLEU with compound splitting is the measure of the paper's Table 2 (EN-DE: base 27.3, big 28.4); "
        "sacreBLEU is the one to compare with other systems."
    ),
}
COMPARABILITY["libreoffice-help-ui"] = COMPARABILITY["libreoffice-help"]  # the help's own test split


def _markdown_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def python_string(text: str) -> str:
    """`text` as a Python string literal in double quotes, for the card's code: quotes and backslashes escaped, and
    every character that is not printable (line ends, control characters, invisible ones such as bidirectional
    overrides, which can make code read otherwise than it runs) written as its escape. Whatever `text` holds, the
    literal is one string and nothing else."""
    escaped = []
    for char in text:
        if char in '"\\':
            escaped.append("\\" + char)
        else:
            escaped.append(char if char.isprintable() else repr(char)[1:-1])
    return '"' + "".join(escaped) + '"'


def yaml_string(text: str) -> str:
    """`text` as a YAML double-quoted scalar, for a card's metadata: `python_string`'s escapes are YAML's too (`\\"`,
    `\\\\`, `\\n`, `\\xXX`, `\\uXXXX`, `\\UXXXXXXXX`), so whatever `text` holds it stays one value and cannot end the
    metadata or add a key to it."""
    return python_string(text)


def trained_with(results: dict) -> dict:
    """The batch size, accumulation, lr_scale and warmup the run trained with: the plan's (`results["plan"]`), or,
    in a folder written before the plan held them all, the recipe's as that folder recorded them."""
    plan, recipe = results.get("plan") or {}, results["recipe"]
    names = ("max_tokens", "gradient_accumulation_steps", "lr_scale", "warmup_steps")
    return {name: plan[name] if plan.get(name) is not None else recipe.get(name, 1) for name in names}


def render_model_card(results: dict, repo_id: str | None = None, plots: list[str] | None = None) -> str:
    """The model card (README.md) of a trained model folder, from its `results.json` contents."""
    values = {
        **_data_values(results),
        **_score_values(results),
        **_model_values(results),
        **_training_values(results),
        **_usage_values(results, repo_id, plots),
        "warning": _warning(results) + _kept(results),
    }
    return TEMPLATE.read_text(encoding="utf-8").format(**values)


def _warning(results: dict) -> str:
    """A warning at the top of the card where the run's model stopped using its source (training/collapse.py)."""
    check = results.get("source_check") or {}
    collapsed = next((e for e in check.get("history", []) if e["step"] == check.get("collapsed_at")), None)
    if collapsed is None:
        return ""
    return (
        f"\n> **Warning: this model does not use its source.** At update {collapsed['step']:,} its validation loss was "
        f"{collapsed['loss']:.3f} with the real sources and {collapsed['loss_shuffled_sources']:.3f} with them "
        f"shuffled (a gain of {collapsed['source_gain']:.3f} nats per token, below {check['nothing_below']}): it "
        "translates every sentence alike. Train it again with a lower peak learning rate or a longer warmup.\n"
    )


def _kept(results: dict) -> str:
    """A fine-tuning run's note at the top of the card: its starting model and the trained one on validation, and
    which the folder holds (training/start.py)."""
    kept = results.get("kept")
    if not kept:
        return ""
    start, trained = kept["start"], kept["trained"]
    held = "the trained model" if kept["kept"] == "trained" else "the model it started from (training made it worse)"
    return (
        f"\n> Fine-tuned from {_markdown_escape(start['model'])}: validation BLEU {start['bleu']:.2f} at the start, "
        f"{trained['bleu']:.2f} trained (greedy, {trained['pairs']} pairs). This folder holds **{held}**.\n"
    )


def _data_values(results: dict) -> dict:
    data = results["data"]
    dataset_id, dataset_name = DATASET_IDS.get(data["dataset"], (data["dataset"], data["dataset"]))
    return {
        "source_lang": data["source_lang"],
        "target_lang": data["target_lang"],
        "license": data.get("license", "mpl-2.0"),
        "dataset_id": dataset_id,
        "dataset_name": dataset_name,
        "dataset_description": data.get("description", dataset_name),
        "train_pairs": data["train_pairs"],
        "validation_pairs": data["validation_pairs"],
        "test_split": TEST_SPLITS.get(data["dataset"], ""),
        "comparability": COMPARABILITY.get(
            data["dataset"], "Your own test pairs: these figures compare with runs on the same pairs only."
        ),
    }


def _score_values(results: dict) -> dict:
    test, choice = results["test"], results.get("length_penalty_choice")
    return {
        "bleu": round(test["bleu"], 2),
        "chrf": round(test["chrf"], 2),
        "tokenized_bleu": round(test["tokenized_bleu"], 2) if test.get("tokenized_bleu") is not None else "n/a",
        "bleu_signature": test["bleu_signature"],
        "chrf_signature": test["chrf_signature"],
        "test_pairs": test["pairs"],
        "test_beams": test["beams"],
        "length_penalty": f"{test.get('length_penalty', 0.6):g}",
        "length_penalty_choice": (
            " (chosen by validation BLEU from "
            + ", ".join(choice["validation_bleu"])
            + ", as §6.1 chose α on the development set)"
            if choice
            else ""
        ),
    }


def _model_values(results: dict) -> dict:
    model = results["model"]
    return {
        "model_name": results.get("name", "vanilla-transformer"),
        "encoder_layers": model["encoder_layers"],
        "decoder_layers": model["decoder_layers"],
        "d_model": model["d_model"],
        "heads": model["encoder_attention_heads"],
        "ffn_dim": model["encoder_ffn_dim"],
        "activation": model["activation_function"],
        "parameters": results["parameters"],
        "vocab_size": model["vocab_size"],
        "sinusoid_layout": model["sinusoid_layout"],
        "label_smoothing": model["label_smoothing"],
        "dropout": model["dropout"],
    }


def _training_values(results: dict) -> dict:
    training, trained = results["training"], trained_with(results)
    accumulation = trained["gradient_accumulation_steps"]
    return {
        "lr_scale": trained["lr_scale"],
        "warmup": trained["warmup_steps"],
        "cooldown": _cooldown(results["recipe"].get("cooldown_fraction") or 0),
        "max_tokens": trained["max_tokens"],
        "accumulation": f", {accumulation} accumulated per update" if accumulation > 1 else "",
        "steps": training["steps"],
        "epochs": round(training["epochs"], 1),
        "train_minutes": round(training["seconds"] / 60, 1),
        "hardware": results.get("hardware", "unknown hardware"),
        "averaged": len(results.get("averaged_checkpoints", [])) or 1,
        "command": public_command(results.get("command", "")),  # (a results.json written before it was redacted)
    }


def _cooldown(fraction: float) -> str:
    """The schedule's cooldown (not the paper's), as the card's recipe line says it; none: nothing."""
    return f", falling linearly to 0 over the last {fraction:.0%} of the updates (not the paper's)" if fraction else ""


def _usage_values(results: dict, repo_id: str | None, plots: list[str] | None) -> dict:
    examples = "\n".join(
        f"| {_markdown_escape(e['source'])} | {_markdown_escape(e['translation'])} | {_markdown_escape(e['reference'])} |"
        for e in results.get("examples", [])
    )
    if examples:
        examples = (
            "Example translations from the test split:\n\n| source | translation | reference |\n|---|---|---|\n"
            + examples
        )
    else:
        examples = (
            "Example translations are left out: the test pairs are the trainer's own data "
            "(`--publish_examples` publishes them)."
        )
    first = results["examples"][0]["source"] if results.get("examples") else None
    return {  # what goes into the code of the card is a Python literal, escaped (python_string)
        "repo_literal": python_string(repo_id or results.get("repo_id", "path/to/model")),
        "example_literal": python_string(first or "Hello world."),
        "examples": examples,
        "plots": "\n\n".join(f"![{Path(p).stem}]({p})" for p in plots or []),
    }


def write_model_card(folder: str | Path, results: dict, plots: list[str] | None = None) -> Path:
    text = render_model_card(results, plots=plots)
    return write_text_atomically(Path(folder) / "README.md", text, at="card")
