"""A saved folder loads with `trust_remote_code=True` in a fresh process where this package cannot be imported."""

from __future__ import annotations

import json

import pytest
import torch

from hf_vanilla_transformer.model import REMOTE_CODE_FILES

from conftest import PAD, random_ids, run_without_package, tiny_model


def test_remote_code_load_gives_identical_outputs(tmp_path):
    model = tiny_model()
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].endswith("VanillaTransformerForConditionalGeneration")
    written = {path.name for path in folder.glob("*.py")}
    assert written == {
        "configuration_vanilla_transformer.py",
        "modeling_vanilla_transformer.py",
        "layers_vanilla_transformer.py",
        "decoding_vanilla_transformer.py",
        "inputs_vanilla_transformer.py",
        "loss_vanilla_transformer.py",
        "padding_vanilla_transformer.py",
        "prenorm_vanilla_transformer.py",
        "tying_vanilla_transformer.py",
        "cache_vanilla_transformer.py",
        "precision_vanilla_transformer.py",
    }

    ids = random_ids(2, 7)
    ids[1, 5:] = PAD
    mask = (ids != PAD).long()
    torch.save({"ids": ids, "mask": mask}, tmp_path / "inputs.pt")
    result = run_without_package(
        f"""
        import torch
        try:
            import hf_vanilla_transformer
            raise SystemExit("the package is importable")
        except ImportError:
            pass
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        inputs = torch.load("inputs.pt")
        with torch.no_grad():
            logits = model(input_ids=inputs["ids"], attention_mask=inputs["mask"],
                           decoder_input_ids=inputs["ids"][:, :4]).logits
        generated = model.generate(inputs["ids"], attention_mask=inputs["mask"], max_new_tokens=6)
        torch.save({{"logits": logits, "generated": generated, "class": type(model).__module__,
                    "beams": model.generation_config.num_beams}}, "outputs.pt")
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    remote = torch.load(tmp_path / "outputs.pt")
    assert "hf_vanilla_transformer" not in remote["class"]  # it really ran the copied file
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :4]).logits
    assert torch.equal(remote["logits"], logits)
    assert torch.equal(remote["generated"], model.generate(ids, attention_mask=mask, max_new_tokens=6))
    assert remote["beams"] == 4


@pytest.mark.parametrize("name", REMOTE_CODE_FILES)
def test_remote_code_files_import_only_torch_transformers_and_each_other(name):
    import ast
    import pathlib

    import hf_vanilla_transformer.model

    source = pathlib.Path(hf_vanilla_transformer.model.__file__).with_name(name).read_text()
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add("." + (node.module or "") if node.level else node.module.split(".")[0])
    siblings = {"." + file.removesuffix(".py") for file in REMOTE_CODE_FILES}
    standard = {"__future__", "math", "collections", "contextlib", "contextvars"}  # the standard library's
    assert roots <= {*standard, "torch", "transformers", *siblings}, roots
    assert "." + name.removesuffix(".py") not in roots


def test_the_modeling_file_reads_like_the_paper():
    """What §3 describes stays in the modeling file and its layers' (no module over 450 lines), post-LN written out;
    the loss, the decoding rules, the cache and mask plumbing and the autocast guard live in its siblings."""
    import pathlib

    import hf_vanilla_transformer.model

    folder = pathlib.Path(hf_vanilla_transformer.model.__file__).parent
    files = [folder / "modeling_vanilla_transformer.py", folder / "layers_vanilla_transformer.py"]
    assert all(len(file.read_text().splitlines()) <= 450 for file in files)
    source = "\n".join(file.read_text() for file in files)
    for moved in (
        "class _LinearLabelSmoothedLoss",
        "def gnmt_length_penalty",
        "def _update_finished_beams",
        "create_causal_mask(",
        "cross_attention_cache",
        "is_autocast_enabled",
        "nonzero(",
    ):
        assert moved not in source, moved
    # The paper's sub-layer, LayerNorm(x + Dropout(Sublayer(x))), in each of the five places it stands.
    assert source.count("_layer_norm(residual + hidden_states)") == 5
