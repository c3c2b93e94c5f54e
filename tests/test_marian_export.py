"""A trained model as a stock MarianMTModel folder (`export --format marian`, issue 64): loaded by transformers with
no remote code and no package, the same logits (a padded batch) and greedy tokens; its ONNX graphs in Optimum's
layout give the same greedy tokens in ONNX Runtime; ours -> Marian -> ours gives the same weights; what the layout
cannot hold is refused in one line; the card and `push --format marian` publish no code; and, in a real browser,
transformers.js translates as we do."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.convert import convert_model
from hf_vanilla_transformer.convert.marian_export import MarianExportError, check_exportable, export_marian
from hf_vanilla_transformer.deploy.onnx_marian import DECODER_FILE, ENCODER_FILE, past_names, present_names
from hf_vanilla_transformer.sharing.hub import check_model_card, push_model_folder

from conftest import FIXTURES, ROOT, run_script, run_without_package, tiny_config


TEST_40 = FIXTURES / "libreoffice_help_en_de_test_40.tsv"


def held_out_sentences() -> list[str]:
    return [line.split("\t")[0] for line in TEST_40.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def exported(trained_folder, tmp_path_factory) -> Path:
    """The trained tiny model (a real tokenizer, 30 updates on real pairs) exported with its ONNX graphs."""
    folder, _ = trained_folder
    return export_marian(folder, tmp_path_factory.mktemp("marian") / "marian", max_positions=512, onnx=True)


def ours(trained_folder):
    folder, _ = trained_folder
    return VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(
        folder
    )


def test_stock_transformers_loads_it_without_the_package_with_the_same_logits(trained_folder, exported, tmp_path):
    """In a process that cannot import the package, `AutoModelForSeq2SeqLM.from_pretrained(folder)` with no remote
    code gives a MarianMTModel whose logits on a padded batch of real sentences (one 40 tokens long, one 3) equal
    ours within 1e-5; the folder holds no code and its config names none."""
    model, tokenizer = ours(trained_folder)
    sentences = [" ".join(held_out_sentences()[:12]), "Open a file."]
    batch = tokenizer(sentences, text_target=["Öffnen Sie eine Datei.", "Datei öffnen und speichern."], padding=True)
    inputs = {key: torch.tensor(value) for key, value in batch.items()}
    decoder_inputs = model.prepare_decoder_input_ids_from_labels(inputs.pop("labels").clamp(min=1))
    np.save(tmp_path / "input_ids.npy", inputs["input_ids"].numpy())
    np.save(tmp_path / "attention_mask.npy", inputs["attention_mask"].numpy())
    np.save(tmp_path / "decoder_input_ids.npy", decoder_inputs.numpy())
    script = f"""
        import numpy, torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        model = AutoModelForSeq2SeqLM.from_pretrained({str(exported)!r}).eval()
        tokenizer = AutoTokenizer.from_pretrained({str(exported)!r})
        batch = {{name: torch.from_numpy(numpy.load(name + ".npy")) for name in
                 ("input_ids", "attention_mask", "decoder_input_ids")}}
        with torch.no_grad():
            numpy.save("logits.npy", model(**batch).logits.numpy())
        print(type(model).__name__, type(tokenizer).__name__, tokenizer("Open a file.")["input_ids"])
    """
    result = run_without_package(script, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[:2] == ["MarianMTModel", "TokenizersBackend"]
    assert json.loads(result.stdout.split(" ", 2)[2]) == tokenizer("Open a file.")["input_ids"]
    assert inputs["input_ids"].shape[1] >= 40 and (inputs["attention_mask"] == 0).any()
    with torch.no_grad():
        expected = model(**inputs, decoder_input_ids=decoder_inputs).logits
    assert np.abs(np.load(tmp_path / "logits.npy") - expected.numpy()).max() <= 1e-5
    assert not list(exported.glob("*.py")) and "auto_map" not in json.loads((exported / "config.json").read_text())


def greedy(model, tokenizer, sentences: list[str], new_tokens: int = 24) -> list[list[int]]:
    """Greedy token ids of `sentences` in one padded batch, at most `new_tokens` new tokens each, specials removed."""
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    extra = {"relative_max_length": None} if isinstance(model, VanillaTransformerForConditionalGeneration) else {}
    with torch.no_grad():
        output = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=new_tokens, **extra)
    special = set(tokenizer.all_special_ids)
    return [[token for token in row.tolist() if token not in special] for row in output]


def onnx_greedy(folder: Path, tokenizer, sentences: list[str], new_tokens: int = 24) -> list[list[int]]:
    """Greedy token ids from the ONNX graphs alone, as transformers.js runs them: the encoder once, then the merged
    decoder one token at a time with its cache, empty at the first step."""
    import onnxruntime

    encoder = onnxruntime.InferenceSession(str(folder / ENCODER_FILE))
    decoder = onnxruntime.InferenceSession(str(folder / DECODER_FILE))
    config = json.loads((folder / "config.json").read_text())
    layers, heads = config["decoder_layers"], config["decoder_attention_heads"]
    batch = tokenizer(sentences, padding=True, return_tensors="np")
    ids, mask = batch["input_ids"].astype(np.int64), batch["attention_mask"].astype(np.int64)
    hidden = encoder.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    shape = (len(sentences), heads, 0, config["d_model"] // heads)
    past = {name: np.zeros(shape, np.float32) for name in past_names(layers)}
    step, rows, done = (
        np.full((len(sentences), 1), config["decoder_start_token_id"], np.int64),
        [],
        np.zeros(len(ids), bool),
    )
    for _ in range(new_tokens):
        feeds = {"input_ids": step, "encoder_attention_mask": mask, "encoder_hidden_states": hidden, **past}
        logits, *present = decoder.run(None, feeds)
        step = logits[:, -1].argmax(-1)[:, None]
        rows.append(np.where(done, config["pad_token_id"], step[:, 0]))
        done |= step[:, 0] == config["eos_token_id"]
        named = dict(zip(present_names(layers), present, strict=True))
        past = {name: named[name.replace("past_key_values", "present")] for name in past_names(layers)}
    special = set(tokenizer.all_special_ids)
    return [[token for token in row if token not in special] for row in np.stack(rows, 1).tolist()]


def test_greedy_tokens_are_ours_in_transformers_and_in_onnx_runtime(trained_folder, exported):
    """The 40 held-out sentences in one padded batch: the same greedy tokens from our model, the stock MarianMTModel
    and the ONNX graphs run by ONNX Runtime with the cache transformers.js keeps; the graphs' inputs and outputs have
    Optimum's names and dimension names."""
    import onnxruntime
    from transformers import AutoModelForSeq2SeqLM

    model, tokenizer = ours(trained_folder)
    sentences = held_out_sentences()
    expected = greedy(model, tokenizer, sentences)
    marian = AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
    assert greedy(marian, AutoTokenizer.from_pretrained(exported), sentences) == expected
    assert onnx_greedy(exported, tokenizer, sentences) == expected
    assert [onnx_greedy(exported, tokenizer, [sentence])[0] for sentence in sentences[:5]] == expected[:5]  # batch 1
    assert sum(map(len, expected)) > 40 * 10  # the sentences translate to tokens: not all empty
    decoder = onnxruntime.InferenceSession(str(exported / DECODER_FILE))
    inputs = {node.name: node.shape for node in decoder.get_inputs()}
    assert list(inputs)[:3] == ["input_ids", "encoder_attention_mask", "encoder_hidden_states"]
    assert inputs["past_key_values.0.decoder.key"] == ["batch_size", 4, "past_decoder_sequence_length", 8]
    assert [node.name for node in decoder.get_outputs()][:3] == [
        "logits",
        "present.0.decoder.key",
        "present.0.decoder.value",
    ]


def test_ours_to_marian_and_back_gives_the_same_weights(trained_folder, exported, tmp_path):
    """`convert` reads the exported folder back into the paper's layout (the note in its config), weight for weight
    equal to the model exported, with the exported tokenizer."""
    folder, _ = trained_folder
    back = convert_model(exported, tmp_path / "back")
    model, again = ours(trained_folder)[0], VanillaTransformerForConditionalGeneration.from_pretrained(back)
    assert again.config.sinusoid_layout == "interleaved"
    mine, theirs = model.state_dict(), again.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[name], theirs[name]) for name in mine)
    tokenizer = AutoTokenizer.from_pretrained(back)
    assert tokenizer("Open a file.")["input_ids"] == AutoTokenizer.from_pretrained(folder)("Open a file.")["input_ids"]


@pytest.mark.parametrize(
    "overrides",
    [
        {"tie_word_embeddings": False, "output_bias": True},
        {"sinusoid_layout": "concat", "activation_function": "gelu"},
        {"scale_embedding": False, "encoder_layers": 1, "decoder_attention_heads": 2},
    ],
)
def test_every_option_marian_holds_keeps_the_logits_and_the_weights(trained_folder, tmp_path, overrides):
    """Random weights (no symmetry a trained model might hide an error behind) in the layouts Marian holds: an
    output projection of its own with a bias (`final_logits_bias`), Marian's own layout (no permutation), another
    activation, unscaled embeddings and other head counts: logits of a padded batch equal ours within 1e-5, and
    `convert` gives the same weights back."""
    from transformers import AutoModelForSeq2SeqLM

    torch.manual_seed(1)
    model = VanillaTransformerForConditionalGeneration(tiny_config(vocab_size=500, **overrides)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    folder = tmp_path / "random"
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(trained_folder[0] / name, folder / name)
    exported = export_marian(folder, tmp_path / "marian", max_positions=64)
    marian = AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
    ids = torch.randint(3, 500, (3, 60))
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    ids[1, 20:] = 1
    decoder_ids = torch.randint(3, 500, (3, 63))
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        found = marian(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    assert (found - expected).abs().max() <= 1e-5
    back = VanillaTransformerForConditionalGeneration.from_pretrained(convert_model(exported, tmp_path / "back"))
    assert back.config.sinusoid_layout == model.config.sinusoid_layout
    mine, theirs = model.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[name], theirs[name]) for name in mine)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"pre_layer_norm": True}, "pre_layer_norm=True: MarianMTModel's layers are post-LN"),
        ({"position_embedding_type": "learned", "max_position_embeddings": 64}, "position_embedding_type='learned'"),
        ({"sinusoid_layout": "fairseq"}, "sinusoid_layout='fairseq'"),
        ({"d_k": 4}, "d_k=4, d_v=None with 4/4 heads: MarianMTModel's heads are d_model / heads wide"),
        ({"source_vocab_size": 50}, "source_vocab_size=50: a source vocabulary of its own is not exported"),
        ({"layer_norm_eps": 1e-6}, "layer_norm_eps=1e-06: MarianMTModel's LayerNorms use 1e-05"),
    ],
)
def test_what_marian_cannot_hold_is_refused_by_name(overrides, named):
    with pytest.raises(
        MarianExportError, match="this model cannot be a MarianMTModel folder: " + named.replace("(", r"\(")
    ):
        check_exportable(tiny_config(**overrides))
    check_exportable(tiny_config())  # the paper's model
    check_exportable(tiny_config(sinusoid_layout="concat", activation_function="swish", output_bias=True))


def test_a_greedy_folder_exports_a_generation_config_transformers_saves(trained_folder, tmp_path):
    """A folder that decodes greedily (num_beams 1) gets no length penalty nor early stopping, which transformers
    refuses to save without beams; a folder's banned tokens and repetition rules go over as they are."""
    from transformers import GenerationConfig

    folder = tmp_path / "greedy"
    shutil.copytree(trained_folder[0], folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    config = GenerationConfig.from_pretrained(folder)
    config.num_beams, config.early_stopping, config.length_penalty, config.no_repeat_ngram_size = 1, False, 1.0, 3
    config.save_pretrained(folder)
    exported = export_marian(folder, tmp_path / "marian", max_positions=256)
    written = json.loads((exported / "generation_config.json").read_text())
    assert written.get("num_beams", 1) == 1 and "length_penalty" not in written and written["max_length"] == 256
    assert written["no_repeat_ngram_size"] == 3 and written["decoder_start_token_id"] == 0


@pytest.mark.slow  # the script, twice, in processes of their own
def test_the_command_refuses_in_one_line_and_writes_nothing(tmp_path):
    torch.manual_seed(0)
    folder = tmp_path / "pre-ln"
    VanillaTransformerForConditionalGeneration(tiny_config(pre_layer_norm=True)).save_pretrained(folder)
    result = run_script("export.py", folder, tmp_path / "out", "--format", "marian")
    assert result.returncode == 1 and not (tmp_path / "out").exists()
    assert result.stderr.strip().splitlines() == [
        "export.py: this model cannot be a MarianMTModel folder: pre_layer_norm=True: MarianMTModel's layers are "
        "post-LN, with no final LayerNorm."
    ]
    result = run_script("export.py", folder, tmp_path / "out", "--to", "onnx", "--onnx")
    assert result.returncode != 0 and "--onnx and --length_penalty apply to --format marian only" in result.stderr


def test_the_card_says_it_needs_no_code_and_push_publishes_none(exported):
    """The card passes the Hub's checks (languages, license, BLEU) and says what differs; a dry-run push of the
    exported folder lists its files and not one of code."""
    card = (exported / "README.md").read_text()
    check_model_card(card)
    assert "It needs no remote code" in card and "no trust_remote_code" in card and str(Path.home()) not in card
    assert "|Y|^α, here α" in card and "`max_length` 512" in card
    plan, url = push_model_folder(exported, "someone/marian-tiny", dry_run=True)
    names = [name for name, _ in plan]
    assert url is None and names == sorted(names) and not any(name.endswith(".py") for name in names)
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", ENCODER_FILE, DECODER_FILE} <= set(names)


@pytest.mark.slow  # the script, exporting the graphs in a process of its own
def test_push_format_marian_exports_and_lists_no_code(trained_folder):
    """`push --format marian --onnx` of a trained folder exports it and lists the exported files, not one of code."""
    folder, _ = trained_folder
    result = run_script("push_to_hub.py", folder, "someone/marian-tiny", "--format", "marian", "--onnx", "--dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Would upload to someone/marian-tiny (" in result.stdout and ".py" not in result.stdout
    assert DECODER_FILE in result.stdout


@pytest.mark.slow  # a process of its own: 8-11 s on a Zen 3
def test_ctranslate2s_own_converter_needs_marian_nmts_start_token(exported, tmp_path):
    """CTranslate2's converter (`ct2-transformers-converter`) reads a MarianMTModel as Marian NMT writes one: the last
    vocabulary entry a `<pad>` it drops, the decoder started from a zero vector (`MarianMTLoader`). This package's
    models start from `<s>`'s learned embedding, which no such vocabulary holds: the converter refuses the folder, and
    the package's own CTranslate2 export (`export --to ctranslate2`) is the way there (docs/deploy.md)."""
    pytest.importorskip("ctranslate2")
    converter = Path(sys.executable).parent / "ct2-transformers-converter"
    if not converter.exists():
        pytest.skip("ctranslate2 is installed without its ct2-transformers-converter command")
    result = subprocess.run(
        [str(converter), "--model", str(exported), "--output_dir", str(tmp_path / "ct2")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0 and "but the model expected a vocabulary of size" in result.stderr


# ---------------------------------------------------------------------------------------------------------------------
# transformers.js in headless Chromium
# ---------------------------------------------------------------------------------------------------------------------

BROWSER_EXAMPLE = ROOT / "examples" / "browser"


def browser_missing() -> str | None:
    """Why the browser test cannot run here, or None: node, the example's npm packages, Debian's Chromium."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (BROWSER_EXAMPLE / "node_modules" / "@huggingface" / "transformers").is_dir():
        return "examples/browser has no node_modules: run `npm ci --ignore-scripts` there (.ci/run does)"
    if not Path(os.environ.get("CHROMIUM", "/usr/bin/chromium")).exists():
        return "Chromium is not installed (Debian's package chromium; .ci/run installs it)"
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
    }

    def log_message(self, *args):  # the test's output, not a log of every request
        pass


def translate_in_browser(model_folder: Path, sentences: list[str], root: Path) -> dict:
    """The page of examples/browser serving `model_folder` (as models/en-de) from 127.0.0.1 on a port of its own,
    opened in headless Chromium by check.mjs on `sentences`; its results (and a screenshot, root/screenshot.png).
    The server and the browser are stopped at the end."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(BROWSER_EXAMPLE / "index.html", root / "index.html")
    (root / "node_modules").symlink_to(BROWSER_EXAMPLE / "node_modules")  # the test's own links
    (root / "models").mkdir()
    (root / "models" / "en-de").symlink_to(model_folder)
    (root / "sentences.json").write_text(json.dumps(sentences), encoding="utf-8")
    handler = lambda *args, **kwargs: _QuietHandler(*args, directory=str(root), **kwargs)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/index.html?model=en-de&sentences=sentences.json"
        result = subprocess.run(
            ["node", str(BROWSER_EXAMPLE / "check.mjs"), url, str((root / "screenshot.png").resolve()), "600"],
            capture_output=True, text=True, timeout=900, cwd=BROWSER_EXAMPLE,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_transformers_js_in_chromium_translates_as_we_do(trained_folder, exported, tmp_path):
    """examples/browser's page, served from 127.0.0.1, loads the exported folder with transformers.js (the npm
    package) in Debian's Chromium, headless, and translates the 40 held-out sentences one at a time, greedily, at
    most their length + 50 tokens (§6.1): the same strings as our greedy search."""
    missing = browser_missing()
    if missing:
        pytest.skip(missing)
    model, tokenizer = ours(trained_folder)
    sentences = held_out_sentences()
    expected = []
    for sentence in sentences:  # one at a time, as the page translates them
        with torch.no_grad():
            output = model.generate(**tokenizer(sentence, return_tensors="pt"), num_beams=1, do_sample=False)
        expected.append(tokenizer.decode(output[0], skip_special_tokens=True))  # the folder's rule: length + 50
    results = translate_in_browser(exported, sentences, tmp_path / "site")
    assert results["translations"] == expected
    assert (tmp_path / "site" / "screenshot.png").stat().st_size > 10_000
