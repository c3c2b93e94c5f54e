"""CTranslate2 and ONNX exports of a briefly trained tiny model.

CTranslate2: decodes the same greedy tokens and scores the same log-probabilities as the model itself; int8 loads
and translates; `translate.py --engine ctranslate2` keeps order and empty lines; what CTranslate2 cannot express, a
bad quantization and a too-long source get clear errors. ONNX Runtime: greedy and beam search (GNMT penalty, the
relative length limit) give `generate()`'s tokens, the step's log-probabilities are the model's; int8 translates;
`translate.py --engine onnx` keeps order and empty lines; bad values and folders get clear errors. Both engines keep
translate()'s bounds (`--max_tokens`, a huge line refused before it is tokenized, a binary file) and end their
errors in one line."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil

import pytest
import torch
from tokenizers import processors

from hf_vanilla_transformer.deploy.ctranslate2 import CTranslate2Translator, export_ctranslate2
from hf_vanilla_transformer.deploy.engines import load_export
from hf_vanilla_transformer.deploy.onnx import cache_names, export_onnx
from hf_vanilla_transformer.deploy.onnx_translator import OnnxTranslator
from hf_vanilla_transformer.deploy.rules import EXPORT_INFO, recorded_decoding

from conftest import reversal_task, run_script, tiny_model, train_on_reversal


SENTENCES = ["w4 w5 w6", "w1 w2 w3 w4", "w8 w9 w10 w11 w12", "w13 w14 w15 w16"]  # training sources


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained 60 updates to reverse word sequences (sources end with </s>, as the package's tokenizer
    makes them), saved with its tokenizer; and its float32 CTranslate2 export (None without ctranslate2). Drawn with
    the Xavier initialization, with which this toy (d_model 32, a constant learning rate, no warmup) is learned in
    60 updates with no near-tie between two tokens anywhere in the tests' sentences: an export computes in another
    order of float32 additions, and a near-tie would flip a token without either side being wrong."""
    root = tmp_path_factory.mktemp("export")
    tokenizer, dataset = reversal_task()
    eos = tokenizer.eos_token_id
    dataset = dataset.map(
        lambda pair: {"input_ids": [*pair["input_ids"], eos], "attention_mask": [*pair["attention_mask"], 1]}
    )
    model = tiny_model(seed=1, vocab_size=len(tokenizer), initialization="xavier").train()
    train_on_reversal(model, tokenizer, dataset, root / "run", max_steps=60, per_device_train_batch_size=16, seed=0)
    model.eval()
    # The saved tokenizer appends </s> to every source, as the package's own tokenizer does (translate() relies on it).
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", eos)]
    )
    folder = root / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    exported = None
    if importlib.util.find_spec("ctranslate2") is not None:
        exported = export_ctranslate2(folder, root / "ct2")
    return folder, exported, model, tokenizer


@pytest.fixture(autouse=True)
def needs_ctranslate2(request):
    if "onnx" not in request.node.name:
        pytest.importorskip("ctranslate2")


@pytest.fixture(scope="module")
def onnx_folder(trained, tmp_path_factory):
    """The trained model's float32 ONNX export."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    return export_onnx(trained[0], tmp_path_factory.mktemp("onnx") / "onnx")


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


@pytest.mark.slow  # worker processes
def test_workers_translate_batches_in_parallel_with_the_same_translations(trained):
    """One worker per thread (the default on a CPU) gives the translations of one worker with every thread, in
    input order, over several batches; a bad number of workers, or workers for an engine without them, is named."""
    _, exported, _, _ = trained
    sentences = [" ".join(f"w{1 + (i * 7 + j) % 9}" for j in range(2 + i % 5)) for i in range(24)] + [""]
    one = CTranslate2Translator(exported, threads=2, workers=1)
    two = CTranslate2Translator(exported, threads=2)
    assert (two.workers, two.threads_per_worker) == (2, 1) and (one.workers, one.threads_per_worker) == (1, 2)
    expected = one.translate(sentences, max_batch_size=4)
    assert two.translate(sentences, max_batch_size=4) == expected
    assert expected[-1] == "" and all(expected[:-1])
    with pytest.raises(ValueError, match="workers=0 is invalid"):
        CTranslate2Translator(exported, workers=0)
    with pytest.raises(ValueError, match="from 1 to threads=2"):
        CTranslate2Translator(exported, threads=2, workers=3)
    with pytest.raises(ValueError, match="ctranslate2 engine only"):
        load_export("onnx", exported, workers=2)
    # Three sentences for two workers (split into smaller batches so that both have one): the same translations.
    assert two.translate(sentences[:3]) == expected[:3]
    result = run_script("translate.py", exported, "--workers", "2", input="w1 w2\n")  # --engine torch
    assert result.returncode == 2 and "--workers applies to --engine ctranslate2 only" in result.stderr


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


def test_the_export_decodes_with_the_models_beams_and_alpha(trained, tmp_path):
    """The main job keeps the α it chose on validation in the model's generation config: the export records it and
    decodes with it by default (also from an export written before the record, from its generation config)."""
    from transformers import GenerationConfig

    folder, _, _, _ = trained
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    generation = GenerationConfig.from_pretrained(copy)
    generation.length_penalty, generation.num_beams = 1.5, 3
    generation.save_pretrained(copy)
    engine = CTranslate2Translator(export_ctranslate2(copy, tmp_path / "ct2"))
    # GNMT's α 1.5 carried over to CTranslate2's L^α: the same growth of the penalty at 20 tokens, 1.5 * 20 / 25.
    assert engine.defaults == {
        "num_beams": 3,
        "length_penalty": 1.2,
        "model_length_penalty": {"alpha": 1.5, "type": "gnmt"},
        "relative_max_length": 50,
    }
    assert "beam_size=3, length_penalty=1.2" in (tmp_path / "ct2" / "README.md").read_text()
    sentences = ["w4 w5 w6", "w1 w2 w3 w4", "w8 w9 w10 w11 w12"]
    calls = []

    class Recorder:  # the real translator, its arguments noted
        def translate_batch(self, *args, translator=engine.translator, **kwargs):
            calls.append(kwargs)
            return translator.translate_batch(*args, **kwargs)

    engine.translator = Recorder()
    assert engine.translate(sentences) == engine.translate(sentences, num_beams=3, length_penalty=1.2)
    assert calls[0]["beam_size"] == 3 and calls[0]["length_penalty"] == 1.2
    info_file = tmp_path / "ct2" / EXPORT_INFO
    info = json.loads(info_file.read_text())
    del info["decoding"]
    info_file.write_text(json.dumps(info))
    assert CTranslate2Translator(tmp_path / "ct2").defaults == engine.defaults
    with pytest.raises(ValueError, match="num_beams=0 is invalid"):
        engine.translate(sentences, num_beams=0)


def test_the_length_penalty_carried_over_to_ctranslate2_grows_as_the_models_at_20_tokens():
    from hf_vanilla_transformer.deploy.ctranslate2 import ctranslate2_alpha

    assert ctranslate2_alpha(0.6) == 0.48 and ctranslate2_alpha(1.5) == 1.2 and ctranslate2_alpha(1.0, length=5) == 0.5
    assert ctranslate2_alpha(1.5, "hf") == 1.5  # transformers' own penalty is CTranslate2's rule
    # Per added token the two log-penalties grow alike at 20 tokens: alpha' / L against alpha / (5 + L).
    gnmt = lambda length: 1.5 * math.log((5 + length) / 6)  # noqa: E731
    ct2 = lambda length: ctranslate2_alpha(1.5) * math.log(length)  # noqa: E731
    assert math.isclose(ct2(20.01) - ct2(19.99), gnmt(20.01) - gnmt(19.99), rel_tol=1e-4)
    assert not math.isclose(ct2(10.01) - ct2(9.99), gnmt(10.01) - gnmt(9.99), rel_tol=1e-2)


def our_tokens(model, tokenizer, sources: list[list[int]], **generate_kwargs) -> list[list[int]]:
    """`generate()`'s tokens for source ids, without the start token and the padding."""
    batch = tokenizer.pad({"input_ids": sources}, return_tensors="pt")
    rows = model.generate(**batch, **generate_kwargs)
    return [[t for t in row.tolist()[1:] if t != tokenizer.pad_token_id] for row in rows]


def test_onnx_greedy_and_beam_search_give_our_tokens(trained, onnx_folder):
    """The NumPy search around the exported step is generate()'s: greedy, beam search with GNMT's penalty, and the
    source length + N limit (a short N cuts hypotheses before their </s>), token for token."""
    _, _, model, tokenizer = trained
    engine = OnnxTranslator(onnx_folder)
    sentences = [*SENTENCES, "w30 w2 w17", "w9", "w3 w3 w3 w3 w3 w3 w3"]  # the last three unseen in training
    sources = engine.encode(sentences)
    assert sources == [
        [*tokenizer(s, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id] for s in sentences
    ]
    for beams, relative in ((1, 50), (4, 50), (3, 50), (4, 2), (1, 2)):
        onnx = engine.search(sources, beams, 0.6, relative)
        assert onnx == our_tokens(model, tokenizer, sources, num_beams=beams, relative_max_length=relative), (
            beams,
            relative,
        )
    # transformers' rules where the model's generation config asks for them: its |Y|^alpha penalty, and
    # early_stopping=False / "never", which search on past num_beams finished hypotheses by transformers' heuristic.
    searched_on = 0
    results = {}
    for penalty, early, alpha in (
        ("hf", False, 2.0),
        ("hf", "never", 1.0),
        ("gnmt", False, 2.0),
        ("gnmt", "never", 2.0),
    ):
        onnx = engine.search(sources, 4, alpha, 50, length_penalty_type=penalty, early_stopping=early)
        kwargs = dict(num_beams=4, length_penalty=alpha, length_penalty_type=penalty, early_stopping=early)
        assert onnx == our_tokens(model, tokenizer, sources, **kwargs), (penalty, early, alpha)
        searched_on += onnx != engine.search(sources, 4, alpha, 50, length_penalty_type=penalty)
        results[penalty, early, alpha] = onnx
    assert searched_on  # searching past the first num_beams finished hypotheses changed a translation
    assert results["hf", False, 2.0] != results["gnmt", False, 2.0]  # the two penalties ranked differently
    # One beam is greedy search whatever early_stopping says: it ends at its first </s>.
    greedy = our_tokens(model, tokenizer, sources, num_beams=1)
    assert engine.search(sources, 1, 2.0, 50, early_stopping="never") == greedy
    with pytest.raises(ValueError, match="length_penalty_type='wu' is invalid"):
        engine.search(sources, 4, 0.6, 50, length_penalty_type="wu")
    with pytest.raises(ValueError, match="early_stopping='always' is invalid"):
        engine.search(sources, 4, 0.6, 50, early_stopping="always")
    # Beam search found finished hypotheses (</s>) and the short limit cut them: both paths were taken.
    assert all(row[-1] == tokenizer.eos_token_id for row in engine.search(sources[:4], 4, 0.6, 50))
    assert all(
        len(row) <= len(source) + 2 for row, source in zip(engine.search(sources, 4, 0.6, 2), sources, strict=True)
    )
    assert engine.translate(["w4 w5 w6", "", "w1 w2 w3 w4"], num_beams=1) == ["w6 w5 w4", "", "w4 w3 w2 w1"]


def test_onnx_export_records_the_models_decoding_rules_and_translates_with_them(onnx_folder, tmp_path):
    from transformers import GenerationConfig

    # A generation config that leaves the rules unset decodes as generate() reads it: alpha 1, |Y|^alpha, no early stop.
    assert recorded_decoding(GenerationConfig(num_beams=2)) == {
        "num_beams": 2,
        "length_penalty": 1.0,
        "length_penalty_type": "hf",
        "early_stopping": False,
        "relative_max_length": 50,
    }
    info = json.loads((onnx_folder / EXPORT_INFO).read_text())
    assert info["generation"] == {  # the trained model's generation config: the paper's rules
        "num_beams": 4,
        "length_penalty": 0.6,
        "length_penalty_type": "gnmt",
        "early_stopping": True,
        "relative_max_length": 50,
    }
    assert "GNMT's ((5 + |Y|) / 6)^alpha length penalty" in (onnx_folder / "README.md").read_text().replace("\n", " ")
    folder = tmp_path / "onnx"
    shutil.copytree(onnx_folder, folder)
    info["generation"] |= {"length_penalty_type": "hf", "early_stopping": "never", "length_penalty": 2.0}
    (folder / EXPORT_INFO).write_text(json.dumps(info))
    engine = OnnxTranslator(folder)
    sentences = [*SENTENCES, "w30 w2 w17", "w3 w3 w3 w3 w3 w3 w3"]
    rules = dict(length_penalty=2.0, length_penalty_type="hf", early_stopping="never")
    assert engine.translate(sentences) == OnnxTranslator(onnx_folder).translate(sentences, **rules)
    for name in ("length_penalty_type", "early_stopping"):  # an export written before the two fields
        del info["generation"][name]
    (folder / EXPORT_INFO).write_text(json.dumps(info))
    assert OnnxTranslator(folder).defaults | {"length_penalty": 0.6} == OnnxTranslator(onnx_folder).defaults


def test_onnx_step_log_probabilities_are_ours(trained, onnx_folder):
    """Teacher-forced through the exported encoder and step, the log-probabilities of every target position equal
    the model's (float32, 1e-4), cached keys and values carried from step to step."""
    import numpy as np

    _, _, model, tokenizer = trained
    engine = OnnxTranslator(onnx_folder)
    sources = engine.encode(SENTENCES[:2])
    batch = tokenizer.pad({"input_ids": sources}, return_tensors="pt")
    targets = torch.tensor([[0, 8, 7, 6, 2], [0, 6, 5, 4, 3]])  # start token, then any ids
    with torch.no_grad():
        ours = model(**batch, decoder_input_ids=targets).logits.log_softmax(-1)
    mask = batch["attention_mask"].numpy()
    cross = engine.encoder.run(None, {"input_ids": batch["input_ids"].numpy(), "attention_mask": mask})
    heads = model.config.decoder_attention_heads
    dims = model.config.head_dims(heads)
    past = [np.zeros((2, heads, 0, dims[i % 2]), dtype=np.float32) for i in range(2 * model.config.decoder_layers)]
    cross_names, past_names, _ = cache_names(model.config.decoder_layers)
    for position in range(targets.shape[1]):
        inputs = {"decoder_input_ids": targets[:, position : position + 1].numpy(), "attention_mask": mask}
        log_probs, *past = engine.step.run(
            None, inputs | dict(zip(cross_names, cross, strict=True)) | dict(zip(past_names, past, strict=True))
        )
        torch.testing.assert_close(torch.from_numpy(log_probs), ours[:, position], rtol=1e-4, atol=1e-4)
    assert past[0].shape[2] == targets.shape[1]  # every step's keys were appended


@pytest.mark.slow  # the script, in a process of its own
def test_onnx_the_translate_script_runs_the_export_keeping_order_and_empty_lines(onnx_folder):
    result = run_script("translate.py", onnx_folder, "--engine", "onnx", input="w4 w5 w6\n\n  \nw1 w2 w3 w4\n")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["w6 w5 w4", "", "", "w4 w3 w2 w1"]


@pytest.mark.slow
def test_onnx_int8_exports_through_the_script_and_translates(trained, onnx_folder, tmp_path):
    folder = tmp_path / "int8"
    result = run_script("export.py", trained[0], folder, "--to", "onnx", "--quantization", "int8")
    assert result.returncode == 0, result.stderr[-2000:]
    import onnx

    for name in ("encoder.onnx", "decoder_step.onnx"):  # the matrix products run on int8 weights
        ops = {node.op_type for node in onnx.load(str(folder / name)).graph.node}
        assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops, (name, sorted(ops))
    outputs = OnnxTranslator(folder).translate(["w4 w5 w6", "", "w1 w2 w3 w4"], num_beams=1)
    assert outputs[1] == "" and outputs[0] and outputs[2]


@pytest.mark.slow  # a script in a process of its own: about 11 s on a Zen 3
def test_onnx_bad_values_and_folders_are_refused_with_their_names(trained, onnx_folder, tmp_path):
    folder, exported, _, _ = trained
    with pytest.raises(ValueError, match="quantization='int16' is invalid"):
        export_onnx(folder, tmp_path / "x", quantization="int16")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        export_onnx(tmp_path / "nowhere", tmp_path / "y")
    with pytest.raises(FileNotFoundError, match="no hf_vanilla_transformer_export.json"):
        OnnxTranslator(folder)
    if exported is not None:
        with pytest.raises(ValueError, match="holds a ctranslate2 export; expected an ONNX one"):
            OnnxTranslator(exported)
    with pytest.raises(ValueError, match="num_beams=0 is invalid"):
        OnnxTranslator(onnx_folder).translate(["w1"], num_beams=0)
    result = run_script("translate.py", folder, "--engine", "onnx", input="w1\n")
    assert result.returncode == 1 and result.stderr.startswith("translate.py: ") and "Traceback" not in result.stderr


@pytest.mark.slow
def test_onnx_score_script_gives_the_models_bleu(trained, onnx_folder, tmp_path):
    """`score.py --engine onnx` scores the export as `score.py` scores the model: the same BLEU, the same lines."""
    import json

    folder = trained[0]
    pairs = tmp_path / "pairs.tsv"
    sources = [*SENTENCES, "w30 w2 w17", "w5 w6 w7 w8 w9"]
    pairs.write_text("".join(f"{s}\t{' '.join(reversed(s.split()))}\n" for s in sources), encoding="utf-8")
    outputs = {}
    for name, model, engine in (("torch", folder, "torch"), ("onnx", onnx_folder, "onnx")):
        out = tmp_path / f"{name}.txt"
        result = run_script("score.py", model, "--engine", engine, "--data_files", pairs, "--output", out)
        assert result.returncode == 0, result.stderr[-2000:]
        outputs[name] = (json.loads(result.stdout)["score"], out.read_text(encoding="utf-8"))
    assert outputs["onnx"] == outputs["torch"] and outputs["torch"][0] > 50


@pytest.mark.slow
def test_deploy_benchmark_runs_every_engine_and_the_exact_ones_agree(trained, tmp_path):
    """`scripts/deploy_benchmark.py` on the trained tiny model and pairs of its task: every engine is timed and
    scored, the compiled model and the float32 ONNX export give ours-eager's BLEU exactly, each engine's memory is
    measured in its own process, and the table names the machine."""
    pytest.importorskip("onnxruntime")
    import json

    pairs = tmp_path / "pairs.tsv"
    sources = [*SENTENCES, "w5 w6 w7 w8 w9", "w20 w21 w22"]
    pairs.write_text("".join(f"{s}\t{' '.join(reversed(s.split()))}\n" for s in sources), encoding="utf-8")
    out = tmp_path / "deploy.json"
    result = run_script(
        "deploy_benchmark.py",
        "--model_dir",
        trained[0],
        "--data_files",
        pairs,
        "--batch_size",
        "4",
        "--alphas",
        "0.6",
        "1.5",
        "--threads",
        "1",
        "--json",
        out,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(out.read_text())
    engines = results["engines"]
    expected = {"ours_eager", "ours_compiled", "onnxruntime_float32", "onnxruntime_int8"}
    expected |= {
        f"ctranslate2_{q}{a}" for q in ("float32", "int8") for a in ("", "_alpha0.6", "_alpha1.5", "_one_worker")
    }
    assert set(engines) == expected and results["pairs"] == len(sources)
    assert engines["ours_eager"]["bleu"] > 50
    for name in ("ours_compiled", "onnxruntime_float32"):
        assert engines[name]["bleu"] == engines["ours_eager"]["bleu"], name
    for name in ("ctranslate2_float32", "ctranslate2_int8"):  # workers change the speed, not the translations
        assert engines[f"{name}_one_worker"]["bleu"] == engines[name]["bleu"], name
    memory = results["peak_rss_above_baseline_bytes"]
    assert set(memory) == {"baseline", "ours_eager", "onnxruntime_float32", "onnxruntime_int8"} | {
        f"ctranslate2_{q}{w}" for q in ("float32", "int8") for w in ("", "_one_worker")
    }
    assert all(value > 0 for value in memory.values())
    assert results["machine"] in result.stdout and "| ctranslate2_int8_alpha1.5 |" in result.stdout
    assert results["ctranslate2_default_alpha"] == 0.48  # the model's GNMT 0.6, carried over


# ---------------------------------------------------------------------------------------------------------------------
# Both engines keep translate()'s bounds, and their errors end in one line (issue 47)
# ---------------------------------------------------------------------------------------------------------------------

LONG = " ".join(["w1 w2 w3 w4"] * 5)  # 20 words: 21 tokens with </s>
ENGINES = ["ctranslate2", "onnx"]


def export_of(engine: str, trained, request):
    """The trained model's export for `engine` (the ONNX one built when first asked for)."""
    return trained[1] if engine == "ctranslate2" else request.getfixturevalue("onnx_folder")


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engine_holds_max_tokens_and_tokenizes_no_huge_line(engine, trained, request):
    """A line of more tokens than `max_tokens` is refused naming it, one of more characters than those tokens can
    hold before it is tokenized; batches of at most `max_tokens` padded tokens translate as one batch does."""
    exported = load_export(engine, export_of(engine, trained, request))
    encode = "tokens" if engine == "ctranslate2" else "encode"
    seen = []
    tokenize = getattr(exported, encode)
    setattr(exported, encode, lambda sentences: seen.extend(map(len, sentences)) or tokenize(sentences))
    with pytest.raises(ValueError, match=r"^line 2 is 21 tokens long, more than max_tokens=8 \(the padded source"):
        exported.translate(["w4 w5 w6", LONG], max_tokens=8)
    with pytest.raises(ValueError, match=r"^line 3 is 1,200,000 characters long, more than max_tokens=100 tokens"):
        exported.translate(["w4 w5 w6", "", "w1 " * 400_000], max_tokens=100)
    assert max(seen) == len(LONG)  # the huge line was never tokenized
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=rf"max_tokens={bad!r} is invalid; expected a positive number of tokens"):
            exported.translate(["w4 w5 w6"], max_tokens=bad)
    whole = exported.translate([*SENTENCES, "", LONG], num_beams=1)
    assert exported.translate([*SENTENCES, "", LONG], num_beams=1, max_tokens=21) == whole  # batches of 1 to 4


@pytest.mark.parametrize("engine", ENGINES)
def test_translate_and_score_with_an_engine_refuse_an_over_long_line_and_a_binary_file_in_one_line(
    engine, trained, request, tmp_path, monkeypatch
):
    from hf_vanilla_transformer.commands import score, translate

    monkeypatch.setattr("hf_vanilla_transformer.data.cache.DEFAULT_CACHE", tmp_path / "cache")
    folder = str(export_of(engine, trained, request))
    lines, pairs, binary = tmp_path / "lines.txt", tmp_path / "pairs.tsv", tmp_path / "binary.bin"
    lines.write_text(f"w4 w5 w6\n{LONG}\n", encoding="utf-8")
    pairs.write_text(f"w4 w5 w6\tw6 w5 w4\n{LONG}\t{LONG}\n", encoding="utf-8")
    binary.write_bytes(bytes(range(128, 256)) * 64)
    too_long = "line 2 is 21 tokens long, more than max_tokens=8 (the padded source tokens of a batch)"
    not_text = f"{binary}:1 is not UTF-8 text (byte 0x80: invalid start byte); expected a UTF-8 text file."
    for command, flag, data in ((translate, "--input", lines), (score, "--data_files", pairs)):
        name = command.__name__.rsplit(".", 1)[1]
        with pytest.raises(SystemExit) as refused:
            command.main([folder, "--engine", engine, flag, str(data), "--max_tokens", "8"], prog=name)
        assert str(refused.value.code).startswith(f"{name}: {too_long}; split it, or raise max_tokens")
        with pytest.raises(SystemExit) as refused:
            command.main([folder, "--engine", engine, flag, str(binary)], prog=name)
        assert refused.value.code == f"{name}: {not_text}"


@pytest.mark.slow  # the script, in a process of its own
def test_the_translate_script_with_onnx_ends_an_over_long_line_in_one_line(onnx_folder):
    """The script end to end (the commands' code is the same for both engines): one line, no traceback."""
    result = run_script("translate.py", onnx_folder, "--engine", "onnx", "--max_tokens", "8", input=f"w4\n{LONG}\n")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "translate.py: line 2 is 21 tokens long, more than max_tokens=8 (the padded source tokens of a batch); split "
        "it, or raise max_tokens (--max_tokens)."
    )


def test_the_exports_record_no_absolute_path(trained, onnx_folder):
    """export_info.json names the model folder it was made from by its name (a shared export tells no local path)."""
    for export in (trained[1], onnx_folder):
        for name in (EXPORT_INFO, "README.md", "config.json", "tokenizer_config.json"):
            if (export / name).exists():
                assert str(trained[0].parent) not in (export / name).read_text(), (export, name)
        assert json.loads((export / EXPORT_INFO).read_text())["source"] == "model"
