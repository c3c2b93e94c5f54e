"""The README's quickstart runs as written, against a small trained-shape model folder; the links of the README and
of docs/ point to files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.data.tokenizer import train_bpe_tokenizer

from conftest import ROOT


def quickstart_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


@pytest.fixture
def main_job_folder(tmp_path, monkeypatch) -> Path:
    """`outputs/vanilla-transformer-en-de` as the main job leaves it (model, tokenizer, generation config), here
    with a tiny model and a BPE learned from a few sentences, in the current directory of the test."""
    texts = ["Open a file.", "Save it.", "Choose Format - Cells.", "Öffnen Sie eine Datei.", "Speichern Sie sie."] * 20
    tokenizer = train_bpe_tokenizer(texts, vocab_size=300, min_frequency=1)
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=len(tokenizer), dropout=0.0)
    folder = tmp_path / "outputs" / "vanilla-transformer-en-de"
    VanillaTransformerForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    monkeypatch.chdir(tmp_path)
    return folder


def test_the_readme_quickstart_runs(main_job_folder, tmp_path, capsys):
    blocks = quickstart_blocks()
    assert len(blocks) == 3, "the quickstart has a translating, a fine-tuning and a publishing block"
    namespace: dict = {}
    exec(compile(blocks[0], "README quickstart: translate", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 and "translation_text" in printed[1]
    exec(compile(blocks[1], "README quickstart: fine-tune", "exec"), namespace)
    fine_tuned = tmp_path / "outputs" / "fine-tuned"
    assert (fine_tuned / "model.safetensors").exists() and (fine_tuned / "loss_vanilla_transformer.py").exists()
    # The publishing block needs the Hub: it must compile and load the repository with trust_remote_code.
    compile(blocks[2], "README quickstart: publish", "exec")
    assert "trust_remote_code=True" in blocks[2] and "vanilla-transformer push" in blocks[2]


@pytest.mark.parametrize("page", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_relative_links_point_to_files_that_exist(page):
    path = ROOT / page if page == "README.md" else ROOT / "docs" / page
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        assert (path.parent / target).exists(), f"{page} links to {target}, which does not exist"
