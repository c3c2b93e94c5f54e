"""What transformers' tooling and users expect of every in-library model, and what users meet at the edges:
`return_dict=False` tuples, a checkpoint without the shared matrix (reported missing, initialised, tied), typed
`**kwargs` that declare the output flags, and blank sentences and bad files through the pipeline and the scripts."""

from __future__ import annotations

import inspect
import io
import runpy
import sys
import typing

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import MarianMTModel, pipeline

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration, VanillaTransformerModel
from hf_vanilla_transformer.data.corpora import read_parallel_file
from hf_vanilla_transformer.data.tokenizer import corpus_texts, train_bpe_tokenizer
from hf_vanilla_transformer.evaluation.translation import translate
from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    VanillaTransformerDecoder,
    VanillaTransformerEncoder,
)

from conftest import EOS, FIXTURES, PAD, ROOT, random_ids, run_script, tiny_model


def assert_same_values(got, expected, where: str = "output") -> None:
    """Tensors equal, nested tuples equal element by element."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, expected), where
        return
    assert isinstance(got, tuple) and len(got) == len(expected), where
    for index, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert_same_values(a, b, f"{where}[{index}]")


# --- return_dict=False ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["per call", "config"])
def test_return_dict_false_returns_the_model_outputs_values_as_a_tuple(how):
    model = tiny_model()
    ids, targets = random_ids(2, 7), random_ids(2, 5, seed=1)
    ids[1, 5:] = PAD
    inputs = {"input_ids": ids, "attention_mask": (ids != PAD).long(), "decoder_input_ids": targets, "use_cache": False}
    labels = random_ids(2, 5, seed=2)
    expected = {
        "lm": model(**inputs, output_hidden_states=True),
        "lm with labels": model(**inputs, labels=labels),
        "base": model.model(**inputs, output_hidden_states=True),
    }
    calls = {
        "lm": lambda **extra: model(**inputs, output_hidden_states=True, **extra),
        "lm with labels": lambda **extra: model(**inputs, labels=labels, **extra),
        "base": lambda **extra: model.model(**inputs, output_hidden_states=True, **extra),
    }
    if how == "config":
        model.config.return_dict = False  # one config object, read by the model, its base model and both stacks
    for name, call in calls.items():
        got = call(return_dict=False) if how == "per call" else call()
        assert isinstance(got, tuple), name
        assert_same_values(got, expected[name].to_tuple(), name)
    # The order every transformers seq2seq model uses: (loss,) logits, then the hidden states.
    assert torch.equal(calls["lm"](return_dict=False)[0], expected["lm"].logits)
    with_labels = calls["lm with labels"](return_dict=False)
    assert torch.equal(with_labels[0], expected["lm with labels"].loss)
    assert torch.equal(with_labels[1], expected["lm with labels"].logits)
    assert torch.equal(calls["base"](return_dict=False)[0], expected["base"].last_hidden_state)
    # generate() asks for ModelOutputs itself, whatever the config says.
    assert model.generate(ids[:1], max_new_tokens=3, num_beams=2).shape[0] == 1


def test_encoder_outputs_are_read_as_a_model_output_another_model_output_or_a_tuple():
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    model = tiny_model()
    ids, targets = random_ids(2, 7), random_ids(2, 5, seed=1)
    mask = (ids != PAD).long()
    encoded = model.get_encoder()(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=targets).logits
    for given in (
        encoded,
        encoded.to_tuple(),
        [encoded.last_hidden_state],
        BaseModelOutputWithPooling(last_hidden_state=encoded.last_hidden_state),
    ):
        got = model(encoder_outputs=given, attention_mask=mask, decoder_input_ids=targets)
        assert torch.equal(got.logits, expected), type(given).__name__
    tupled = model(encoder_outputs=encoded.to_tuple(), attention_mask=mask, decoder_input_ids=targets)
    assert len(tupled.encoder_hidden_states) == len(encoded.hidden_states)
    for bad in (encoded.last_hidden_state, ()):
        with pytest.raises(ValueError, match="encoder_outputs must be a BaseModelOutput or a tuple"):
            model(encoder_outputs=bad, attention_mask=mask, decoder_input_ids=targets)


# --- a checkpoint without the shared matrix ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model_class, key",
    [(VanillaTransformerForConditionalGeneration, "model.shared.weight"), (VanillaTransformerModel, "shared.weight")],
)
def test_a_checkpoint_without_the_shared_matrix_reports_it_missing_and_initialises_it(tmp_path, model_class, key):
    full = tiny_model(seed=4)
    saved = full if model_class is VanillaTransformerForConditionalGeneration else full.model
    saved.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights[key]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})

    loaded, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
    assert key in info["missing_keys"]
    assert not [name for name, p in loaded.named_parameters() if p.device.type == "meta"]
    base = loaded.model if model_class is VanillaTransformerForConditionalGeneration else loaded
    shared = base.shared.weight
    assert base.encoder.embed_tokens.weight is shared and base.decoder.embed_tokens.weight is shared
    if model_class is VanillaTransformerForConditionalGeneration:
        assert loaded.lm_head.weight is shared
    # Initialised by the model's rule (the default initialization: N(0, 0.02)), not left as whatever memory held.
    assert shared.std().item() == pytest.approx(0.02, rel=0.1) and shared.mean().abs().item() < 0.002
    # Every other weight is the checkpoint's.
    reference = saved.state_dict()
    for name, value in loaded.state_dict().items():
        if "shared" not in name and "embed_tokens" not in name and "lm_head" not in name:
            assert torch.equal(value, reference[name]), name
    output = loaded(input_ids=random_ids(1, 4), decoder_input_ids=torch.tensor([[0, 5]]))
    assert output[0].shape[:2] == (1, 2) and torch.isfinite(output[0]).all()


# --- typed **kwargs ---------------------------------------------------------------------------------------------------


def declared_kwargs(function) -> set[str]:
    """The keyword arguments that a `**kwargs: Unpack[SomeTypedDict]` parameter declares, read the way transformers'
    tooling reads them (`utils/auto_docstring.py`: the annotation of the VAR_KEYWORD parameter, its `__args__[0]`,
    that TypedDict's annotations); empty when `**kwargs` is untyped."""
    var_keyword = [
        p for p in inspect.signature(function).parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD
    ]
    if not var_keyword:
        return set()
    annotation = var_keyword[0].annotation
    if typing.get_origin(annotation) is not typing.Unpack:
        return set()
    return set(annotation.__args__[0].__annotations__)


def test_forward_signatures_declare_the_output_flags_as_in_library_models():
    flags = {"output_attentions", "output_hidden_states"}
    assert flags <= declared_kwargs(MarianMTModel.forward)  # the reference reads the same way
    for module_class in (
        VanillaTransformerForConditionalGeneration,
        VanillaTransformerModel,
        VanillaTransformerEncoder,
        VanillaTransformerDecoder,
    ):
        assert flags <= declared_kwargs(module_class.forward), module_class.__name__


def test_the_declared_output_flags_return_attentions_and_hidden_states():
    model = tiny_model()
    model.set_attn_implementation("eager")
    ids, targets = random_ids(2, 6), random_ids(2, 4, seed=1)
    out = model(input_ids=ids, decoder_input_ids=targets, output_attentions=True, output_hidden_states=True)
    layers, heads = model.config.encoder_layers, model.config.encoder_attention_heads
    assert [a.shape for a in out.encoder_attentions] == [(2, heads, 6, 6)] * layers
    assert [a.shape for a in out.cross_attentions] == [(2, heads, 4, 6)] * layers
    assert len(out.encoder_hidden_states) == len(out.decoder_hidden_states) == layers + 1
    generated = model.generate(
        ids, num_beams=1, max_new_tokens=3, suppress_tokens=[EOS], output_attentions=True, return_dict_in_generate=True
    )
    assert len(generated.encoder_attentions) == layers and len(generated.cross_attentions) == 3


# --- blank sentences and bad files ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A tiny untrained model with a real BPE tokenizer, saved as a model folder; it writes at most source + 4
    tokens (an untrained model never ends a sentence by itself)."""
    tokenizer = train_bpe_tokenizer(corpus_texts(read_parallel_file(FIXTURES / "libreoffice_help_en_de_200.tsv")), 300)
    model = tiny_model(seed=7, vocab_size=len(tokenizer))
    model.generation_config.relative_max_length = 4
    folder = tmp_path_factory.mktemp("model")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class CountingGenerate:
    """Wraps `model.generate` and records the number of source rows of every call."""

    def __init__(self, model):
        self.rows, self.generate = [], model.generate
        model.generate = self

    def __call__(self, *args, **kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        self.rows.append(ids.shape[0])
        return self.generate(*args, **kwargs)


def test_translate_returns_blank_sentences_empty_without_running_the_model(model_folder):
    from transformers import AutoTokenizer

    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_folder)
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    counter = CountingGenerate(model)
    sentences = ["", "Tools", "   ", "\t", "Open a document."]
    outputs = translate(model, tokenizer, sentences, progress=False, num_beams=1)
    assert counter.rows == [2]  # one batch, the two real sentences
    assert outputs[0] == outputs[2] == outputs[3] == ""
    assert outputs[1] == translate(model, tokenizer, ["Tools"], progress=False, num_beams=1)[0]
    assert outputs[1] != ""  # an untrained model repeats tokens: a blank result would be the model's, by chance
    counter.rows.clear()
    assert translate(model, tokenizer, ["", " "], progress=False) == ["", ""]
    assert counter.rows == []


def test_the_pipeline_returns_blank_sentences_empty_without_running_the_model(model_folder):
    translator = pipeline("translation", model=str(model_folder))
    counter = CountingGenerate(translator.model)
    assert translator("") == [{"translation_text": ""}]
    assert translator(["  ", "\n"], num_beams=1) == [{"translation_text": ""}] * 2
    assert counter.rows == []
    mixed = translator(["", "Tools", " "], num_beams=1)
    assert counter.rows == [1]
    assert mixed[0] == mixed[2] == {"translation_text": ""}
    assert mixed[1] == translator("Tools", num_beams=1)[0] and mixed[1]["translation_text"] != ""
    several = translator(["", "Tools"], num_beams=2, num_return_sequences=2)
    assert several[0] == [{"translation_text": ""}] * 2 and len(several[1]) == 2


@pytest.mark.slow  # a script in a process of its own: about 11 s on a Zen 3
def test_translate_script_writes_blank_lines_for_blank_input(model_folder):
    lines = ["Tools", "", "   ", "Open a document."]
    result = run_script("translate.py", model_folder, "--num_beams", "1", input="\n".join(lines) + "\n", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    written = result.stdout.split("\n")
    assert written[-1] == "" and len(written) == len(lines) + 1
    assert written[1] == written[2] == ""
    assert written[0] != "" and written[3] != ""


def assert_one_line_error(result, *needles: str) -> None:
    """The script failed with a single line on standard error, no traceback, naming every needle."""
    assert result.returncode != 0
    message = result.stderr.strip()
    assert "Traceback" not in message and len(message.splitlines()) == 1, message[-2000:]
    for needle in needles:
        assert needle in message, message


@pytest.mark.slow  # the script, in a process of its own
def test_score_script_names_the_file_and_line_of_a_bad_tsv(model_folder, tmp_path):
    data = tmp_path / "pairs.tsv"
    data.write_text("Tools\tExtras\nno tab on this line\nOpen\tÖffnen\n", encoding="utf-8")
    result = run_script("score.py", model_folder, "--data_files", data, timeout=300)
    assert_one_line_error(result, "pairs.tsv:2", "1 tab-separated fields", "exactly 2", "no tab on this line")


@pytest.mark.slow  # a script in a process of its own: about 11 s on a Zen 3
def test_score_script_names_a_missing_model_folder(tmp_path):
    data = tmp_path / "pairs.tsv"
    data.write_text("Tools\tExtras\n", encoding="utf-8")
    result = run_script("score.py", tmp_path / "no_such_model", "--data_files", data, timeout=300)
    assert_one_line_error(result, "no_such_model", "does not exist", "model folder")


def exit_message(monkeypatch, script: str, *args, stdin: bytes | None = None) -> str:
    """Run scripts/<script> in this process as from the command line; the message it exits with."""
    monkeypatch.setattr(sys, "argv", [script, *map(str, args)])
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "scripts" / script), run_name="__main__")
    message = exit_info.value.code
    assert isinstance(message, str) and "\n" not in message, message  # SystemExit(str): one line, status 1
    return message


def test_the_scripts_end_bad_input_with_one_line_naming_it(model_folder, tmp_path, monkeypatch):
    missing = tmp_path / "missing.txt"
    assert "missing.txt does not exist" in exit_message(monkeypatch, "translate.py", model_folder, "--input", missing)
    assert "missing.txt" in exit_message(monkeypatch, "score.py", model_folder, "--data_files", missing)
    binary = tmp_path / "latin1.txt"
    binary.write_bytes("Tools\nÖffnen\n".encode("latin-1"))
    message = exit_message(monkeypatch, "translate.py", model_folder, "--input", binary)
    assert "latin1.txt:2 is not UTF-8 text" in message
    message = exit_message(monkeypatch, "translate.py", model_folder, stdin=b"ok\n\xff\n")
    assert "<stdin>:2 is not UTF-8 text" in message
    message = exit_message(monkeypatch, "translate.py", tmp_path / "nowhere", stdin=b"Tools\n")
    assert "nowhere does not exist; expected a model folder" in message
    message = exit_message(monkeypatch, "translate.py", tmp_path, stdin=b"Tools\n")  # a folder without a model
    assert "Cannot load a model and its tokenizer from" in message and str(tmp_path) in message
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"source": "a", "target": "b"}\n{"source": "a",\n', encoding="utf-8")
    message = exit_message(monkeypatch, "score.py", model_folder, "--data_files", jsonl)
    assert "pairs.jsonl:2 is not JSON" in message and "one object per line" in message
