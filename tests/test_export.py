"""CTranslate2 export: a briefly trained tiny model, converted, decodes the same greedy tokens and scores the same
log-probabilities as the model itself; int8 loads and translates; `translate.py --engine ctranslate2` keeps order
and empty lines; what CTranslate2 cannot express, a bad quantization and a too-long source get clear errors."""

from __future__ import annotations

import pytest
import torch

from hf_vanilla_transformer.export import CTranslate2Translator, export_ctranslate2

from conftest import reversal_task, run_script, tiny_model, train_on_reversal


pytest.importorskip("ctranslate2")

SENTENCES = ["w4 w5 w6", "w1 w2 w3 w4", "w8 w9 w10 w11 w12", "w13 w14 w15 w16"]  # training sources


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained 60 updates to reverse word sequences (sources end with </s>, as the package's tokenizer
    makes them), saved with its tokenizer; and its float32 CTranslate2 export."""
    root = tmp_path_factory.mktemp("export")
    tokenizer, dataset = reversal_task()
    eos = tokenizer.eos_token_id
    dataset = dataset.map(
        lambda pair: {"input_ids": [*pair["input_ids"], eos], "attention_mask": [*pair["attention_mask"], 1]}
    )
    model = tiny_model(seed=1, vocab_size=len(tokenizer)).train()
    train_on_reversal(model, tokenizer, dataset, root / "run", max_steps=60, per_device_train_batch_size=16, seed=0)
    model.eval()
    folder = root / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, export_ctranslate2(folder, root / "ct2"), model, tokenizer


def source_ids(tokenizer, sentences: list[str]) -> dict[str, torch.Tensor]:
    ids = [[*tokenizer(s, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id] for s in sentences]
    return tokenizer.pad({"input_ids": ids}, return_tensors="pt")


def test_greedy_decoding_gives_our_tokens(trained):
    _, exported, model, tokenizer = trained
    engine = CTranslate2Translator(exported)
    results = engine.translator.translate_batch(engine.tokens(SENTENCES), beam_size=1, max_decoding_length=20)
    ours = model.generate(**source_ids(tokenizer, SENTENCES), num_beams=1, max_new_tokens=20)
    for result, row in zip(results, ours, strict=True):
        tokens = tokenizer.convert_ids_to_tokens([t for t in row.tolist()[1:] if t not in (0, 1, 2)])
        assert result.hypotheses[0] == tokens
    # The model learned its task, so the comparison is of real translations, not of degenerate repeats.
    assert engine.translate(["w4 w5 w6", "w1 w2 w3 w4"], num_beams=1) == ["w6 w5 w4", "w4 w3 w2 w1"]


def test_scores_are_our_log_probabilities(trained):
    """CTranslate2's per-token log-probabilities of given targets equal ours (float32, 1e-4)."""
    _, exported, model, tokenizer = trained
    engine = CTranslate2Translator(exported)
    targets = [" ".join(reversed(s.split())) for s in SENTENCES]
    target_tokens = [tokenizer.tokenize(t) for t in targets]
    scored = engine.translator.score_batch(engine.tokens(SENTENCES), target_tokens)
    for i, (sentence, target) in enumerate(zip(SENTENCES, targets, strict=True)):
        labels = torch.tensor([[*tokenizer(target, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]])
        with torch.no_grad():
            logits = model(**source_ids(tokenizer, [sentence]), labels=labels).logits
        ours = torch.log_softmax(logits[0], dim=-1).gather(-1, labels[0, :, None])[:, 0]
        torch.testing.assert_close(torch.tensor(scored[i].log_probs), ours, rtol=1e-4, atol=1e-4)


def test_int8_loads_and_translates(trained, tmp_path):
    folder, _, _, _ = trained
    engine = CTranslate2Translator(export_ctranslate2(folder, tmp_path / "int8", quantization="int8"))
    outputs = engine.translate(["w4 w5 w6", "", "w1 w2 w3 w4"])
    assert outputs[1] == "" and outputs[0] and outputs[2]


def test_the_translate_script_runs_the_export_keeping_order_and_empty_lines(trained):
    _, exported, _, _ = trained
    result = run_script(
        "translate.py", exported, "--engine", "ctranslate2", "--num_beams", "1", input="w4 w5 w6\n\nw1 w2 w3 w4\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["w6 w5 w4", "", "w4 w3 w2 w1"]


def test_what_cannot_be_exported_is_refused_with_its_value(trained, tmp_path):
    folder, _, _, tokenizer = trained
    with pytest.raises(ValueError, match="quantization='int4' is invalid"):
        export_ctranslate2(folder, tmp_path / "x", quantization="int4")
    odd = tiny_model(vocab_size=len(tokenizer), d_k=8, d_v=16)
    odd.save_pretrained(tmp_path / "odd")
    tokenizer.save_pretrained(tmp_path / "odd")
    with pytest.raises(ValueError, match="d_k=8, d_v=16"):
        export_ctranslate2(tmp_path / "odd", tmp_path / "odd-ct2")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        export_ctranslate2(tmp_path / "nowhere", tmp_path / "y")
    short = CTranslate2Translator(export_ctranslate2(folder, tmp_path / "short", max_positions=4))
    with pytest.raises(ValueError, match="longer than this export's 3"):
        short.translate(["w1 w2 w3 w4 w5"])
