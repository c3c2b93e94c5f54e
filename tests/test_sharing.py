"""Sharing a trained folder: Hub staging and upload operations, the model card's metadata, the translation pipeline
(with the package and through remote code without it), and the pictures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from huggingface_hub import CommitOperationAdd, ModelCard
from transformers import AutoTokenizer, pipeline

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.sharing.hub import (
    PublishError,
    check_model_card,
    commit_operations,
    push_model_folder,
    stage_for_hub,
    upload_plan,
)
from hf_vanilla_transformer.sharing.model_card import render_model_card
from hf_vanilla_transformer.sharing.plots import (
    attention_maps,
    plot_attention,
    plot_positional_encoding,
    plot_training_curves,
)

from conftest import run_script, run_without_package, tiny_model


EXPECTED_UPLOAD = {
    "README.md",
    "config.json",
    "cache_vanilla_transformer.py",
    "configuration_vanilla_transformer.py",
    "decoding_vanilla_transformer.py",
    "generation_config.json",
    "inputs_vanilla_transformer.py",
    "loss_vanilla_transformer.py",
    "padding_vanilla_transformer.py",
    "precision_vanilla_transformer.py",
    "prenorm_vanilla_transformer.py",
    "tying_vanilla_transformer.py",
    "model.safetensors",
    "modeling_vanilla_transformer.py",
    "layers_vanilla_transformer.py",
    "pipeline_vanilla_transformer.py",
    "plots/attention_cross.png",
    "plots/attention_decoder.png",
    "plots/attention_encoder.png",
    "plots/positional_encoding.png",
    "plots/training_curves.png",
    "results.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "training_log.json",
}


def assert_real_png(path) -> None:
    """A PNG that matplotlib reads back, with a picture in it: many colours, not one flat fill."""
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    pixels = matplotlib.image.imread(path)[..., :3]
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    colours = np.unique((pixels.reshape(-1, 3) * 255).astype(np.uint8), axis=0)
    assert len(colours) > 50, (path, len(colours))
    assert (pixels < 0.9).mean() > 0.02, path  # more than a white page with a few lines


# ---------------------------------------------------------------------------------------------------------------------
# Hub
# ---------------------------------------------------------------------------------------------------------------------


def test_dry_run_lists_the_complete_file_set_with_sizes(trained_folder):
    folder, _ = trained_folder
    result = run_script(
        "push_to_hub.py",
        *(folder, "me/transformer-en-de", "--dry-run"),
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_TOKEN": ""},
    )
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.splitlines()[1:-1]}
    assert listed == EXPECTED_UPLOAD
    assert "checkpoint" not in result.stdout  # training leftovers stay home
    size = (folder / "model.safetensors").stat().st_size
    assert f"{size / 2**20:.1f} MiB" in result.stdout or f"{size / 2**10:.1f} KiB" in result.stdout


def test_staged_folder_has_the_pipeline_and_a_card_for_the_repository(trained_folder, tmp_path):
    folder, _ = trained_folder
    staged, refused = stage_for_hub(folder, tmp_path / "stage", repo_id="me/transformer-en-de")
    assert {path.relative_to(tmp_path / "stage").as_posix() for path in staged} == EXPECTED_UPLOAD and not refused
    config = json.loads((tmp_path / "stage" / "config.json").read_text())
    assert (
        config["custom_pipelines"]["translation"]["impl"] == "pipeline_vanilla_transformer.VanillaTranslationPipeline"
    )
    assert "AutoModelForSeq2SeqLM" in config["auto_map"]
    card = (tmp_path / "stage" / "README.md").read_text()
    assert 'from_pretrained("me/transformer-en-de", trust_remote_code=True)' in card
    assert "![training_curves](plots/training_curves.png)" in card
    assert "custom_pipelines" not in json.loads((folder / "config.json").read_text())  # the folder is untouched


def test_a_folder_needs_the_code_files_its_modeling_file_imports(trained_folder, tmp_path):
    """A folder saved before the layers had a file of their own (its modeling file holds them) publishes without
    one; a folder whose modeling file imports the layers' file and lacks it is refused, naming it."""
    import re
    import shutil

    folder, _ = trained_folder
    older, broken = tmp_path / "older", tmp_path / "broken"
    for copy in (older, broken):
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("checkpoint-*"))
        (copy / "layers_vanilla_transformer.py").unlink()
    modeling = (older / "modeling_vanilla_transformer.py").read_text()
    (older / "modeling_vanilla_transformer.py").write_text(
        re.sub(r"from \.layers_vanilla_transformer import \([^)]*\)\n", "", modeling)
    )
    staged, refused = stage_for_hub(older, tmp_path / "older-stage", repo_id="me/x")
    names = {path.relative_to(tmp_path / "older-stage").as_posix() for path in staged}
    assert names == EXPECTED_UPLOAD - {"layers_vanilla_transformer.py"} and not refused
    with pytest.raises(PublishError, match="layers_vanilla_transformer.py missing"):
        stage_for_hub(broken, tmp_path / "broken-stage", repo_id="me/x")


def test_upload_builds_one_commit_of_every_staged_file(trained_folder, tmp_path):
    folder, _ = trained_folder
    stage_for_hub(folder, tmp_path / "stage", repo_id="me/x")
    operations = commit_operations(tmp_path / "stage")
    assert all(isinstance(operation, CommitOperationAdd) for operation in operations)
    assert {operation.path_in_repo for operation in operations} == EXPECTED_UPLOAD
    weights = next(operation for operation in operations if operation.path_in_repo == "model.safetensors")
    assert weights.upload_info.size == (folder / "model.safetensors").stat().st_size
    assert dict(upload_plan(tmp_path / "stage"))["model.safetensors"] == weights.upload_info.size


def test_no_token_is_a_clear_error_before_any_network(trained_folder, monkeypatch, tmp_path):
    folder, _ = trained_folder
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "no_token"))  # no stored token
    monkeypatch.setattr("huggingface_hub.constants.HF_STORED_TOKENS_PATH", str(tmp_path / "no_tokens"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.HfApi.create_repo", lambda *a, **k: pytest.fail("reached the network"))
    with pytest.raises(PublishError, match="No Hugging Face token"):
        push_model_folder(folder, "me/x", token=None)


@pytest.mark.slow  # a script in a process of its own: about 11 s on a Zen 3
def test_unreachable_hub_is_a_clear_error_and_nothing_is_committed(trained_folder):
    folder, _ = trained_folder
    # A real upload attempt against an endpoint where nothing listens (port 9, discard): the error is ours, clear.
    script = f"""
import sys
from hf_vanilla_transformer.sharing.hub import PublishError, push_model_folder
try:
    push_model_folder({str(folder)!r}, "me/x", token="hf_not_a_real_token")
except PublishError as error:
    print(error)
    sys.exit(3)
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0", "HF_HUB_ETAG_TIMEOUT": "2"},
    )
    assert result.returncode == 3, result.stderr[-2000:]
    assert "Cannot reach the Hugging Face Hub" in result.stdout and "Nothing was uploaded" in result.stdout


def test_a_folder_that_is_not_a_model_is_refused_with_the_missing_files(tmp_path):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    with pytest.raises(PublishError, match="model.safetensors, tokenizer.json, configuration_vanilla_transformer.py"):
        push_model_folder(tmp_path / "half", "me/x", dry_run=True)
    for bad in ("a/b/c", "me/", "me/with space"):
        with pytest.raises(PublishError, match=f"repo_id={bad!r} is invalid"):
            push_model_folder(tmp_path / "half", bad, dry_run=True)


# ---------------------------------------------------------------------------------------------------------------------
# Model card
# ---------------------------------------------------------------------------------------------------------------------


def test_the_filled_card_validates_and_holds_the_runs_bleu(trained_folder):
    folder, _ = trained_folder
    results = json.loads((folder / "results.json").read_text())
    text = (folder / "README.md").read_text()
    card = check_model_card(text)
    assert isinstance(card, ModelCard)
    assert card.data.pipeline_tag == "translation" and card.data.language == ["en", "de"]
    assert card.data.license == "mpl-2.0" and "translation" in card.data.tags
    bleu = next(result for result in card.data.eval_results if result.metric_type == "bleu")
    assert bleu.metric_value == round(results["test"]["bleu"], 2)
    assert bleu.task_type == "translation" and bleu.dataset_split == "test"
    chrf = next(result for result in card.data.eval_results if result.metric_type == "chrf")
    assert chrf.metric_value == round(results["test"]["chrf"], 2)


def test_the_card_states_a_cooldown_where_the_run_used_one_and_nothing_where_not(trained_folder):
    folder, _ = trained_folder
    results = json.loads((folder / "results.json").read_text())
    clause = "falling linearly to 0 over the last 25% of the updates (not the paper's)"
    assert clause not in render_model_card(results) and results["recipe"]["cooldown_fraction"] == 0
    results["recipe"]["cooldown_fraction"] = 0.25
    assert f"^-1.5), {clause}; label smoothing" in render_model_card(results).replace("\n  ", " ")
    del results["recipe"]["cooldown_fraction"]  # as a folder of an earlier version records it
    assert clause not in render_model_card(results)


def test_card_check_names_what_is_missing():
    with pytest.raises(PublishError, match="pipeline_tag is None.*no BLEU"):
        check_model_card("---\nlanguage: [en, de]\nlicense: mit\ntags: [translation]\n---\n# a model\n")


# ---------------------------------------------------------------------------------------------------------------------
# Pipeline
# ---------------------------------------------------------------------------------------------------------------------


def test_pipeline_with_the_package_imported_matches_generate(trained_folder):
    folder, _ = trained_folder
    sources = ["Choose Format - Cells.", "Click the Save button to save the document.", "Tools"]
    translator = pipeline("translation", model=str(folder))
    single = translator(sources[0], num_beams=1)
    batched = translator(sources, batch_size=2, num_beams=1)
    assert isinstance(single, list) and len(single) == 1 and set(single[0]) == {"translation_text"}  # as transformers 4
    assert batched[0] == single[0] and len(batched) == 3

    model = VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    expected = [
        tokenizer.decode(
            model.generate(**tokenizer([text], return_tensors="pt"), num_beams=1)[0], skip_special_tokens=True
        )
        for text in sources
    ]
    assert [item["translation_text"] for item in batched] == [text.strip() for text in expected]
    with pytest.raises(TypeError, match="strings"):
        translator([1, 2])
    assert translator([]) == []
    # Several sequences per source: a list of them per source, in the order generate() returns them.
    several = translator(sources[:2], batch_size=2, num_beams=3, num_return_sequences=2)
    assert [len(items) for items in several] == [2, 2]
    ids = model.generate(**tokenizer(sources[:1], return_tensors="pt"), num_beams=3, num_return_sequences=2)
    assert [item["translation_text"] for item in several[0]] == [
        text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)
    ]
    assert len(translator(sources[0], num_beams=3, num_return_sequences=2)) == 2


def test_pipeline_through_remote_code_without_the_package(trained_folder, tmp_path):
    folder, _ = trained_folder
    stage_for_hub(folder, tmp_path / "stage", repo_id="me/x")
    sources = ["Choose Format - Cells.", "Tools"]
    with_package = pipeline("translation", model=str(folder))  # this package's pipeline and model
    expected = [item["translation_text"] for item in with_package(sources, num_beams=2)]
    result = run_without_package(
        f"""
        import json
        from transformers import pipeline
        translator = pipeline("translation", model={str(tmp_path / "stage")!r}, trust_remote_code=True)
        out = translator({sources!r}, batch_size=2, num_beams=2)
        print(json.dumps({{"out": out, "class": type(translator).__module__}}))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert "hf_vanilla_transformer" not in payload["class"]
    assert [item["translation_text"] for item in payload["out"]] == expected


# ---------------------------------------------------------------------------------------------------------------------
# Pictures
# ---------------------------------------------------------------------------------------------------------------------


def test_the_run_wrote_every_plot_as_a_real_picture(trained_folder):
    folder, _ = trained_folder
    for name in ("training_curves", "positional_encoding", "attention_encoder", "attention_decoder", "attention_cross"):
        assert_real_png(folder / "plots" / f"{name}.png")


def test_attention_maps_are_the_models_weights_for_each_layer_and_head(trained_folder):
    folder, _ = trained_folder
    model = VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    maps = attention_maps(model, tokenizer, "Choose Format - Cells.", translation="Wählen Sie Format - Zellen.")
    config = model.config
    source, queries = len(maps["source_tokens"]), len(maps["decoder_input_tokens"])
    assert maps["encoder"].shape == (config.encoder_layers, config.encoder_attention_heads, source, source)
    assert maps["cross"].shape == (config.decoder_layers, config.decoder_attention_heads, queries, source)
    assert torch.allclose(maps["cross"].sum(-1), torch.ones(()), atol=1e-5)  # rows are distributions
    assert torch.all(maps["decoder"].triu(1) == 0)  # no query looks ahead
    assert model.config._attn_implementation == "sdpa"  # the eager switch for the weights is undone


def test_plot_functions_write_pictures_and_refuse_bad_input(tmp_path):
    model, tokenizer = tiny_model(), None
    assert_real_png(plot_positional_encoding(64, tmp_path / "pe.png"))
    log = [{"step": s, "loss": 9 - s / 10, "learning_rate": s * 1e-4} for s in range(1, 40)]
    log += [{"step": 20, "eval_bleu": 3.0, "eval_loss": 7.0}, {"step": 39, "eval_bleu": 9.0, "eval_loss": 6.0}]
    assert_real_png(plot_training_curves(log, tmp_path / "curves.png"))
    with pytest.raises(ValueError, match="no training loss"):
        plot_training_curves([{"step": 1, "eval_bleu": 1.0}], tmp_path / "x.png")
    with pytest.raises(ValueError, match="sentence=''"):
        plot_attention(model, tokenizer, "", tmp_path)


@pytest.mark.slow
def test_plot_attention_script_draws_any_sentence(trained_folder, tmp_path):
    folder, _ = trained_folder
    result = run_script("plot_attention.py", folder, "Open the Tools menu.", "--output_dir", tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    for name in ("attention_encoder", "attention_decoder", "attention_cross"):
        assert_real_png(tmp_path / f"{name}.png")
    assert "translation:" in result.stdout
