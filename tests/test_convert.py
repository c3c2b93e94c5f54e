"""Converting MarianMTModel and FSMT folders and fairseq checkpoints (hf_vanilla_transformer.convert), offline: each
source built here with its own classes (tests/convert_sources.py); the converted model gives the source's logits
(1e-5, padded batches) and the source's tokens with greedy and beam search under the source's decoding settings, its
tokenizer gives the source tokenizer's ids on the 240 fixture sentences; a fairseq checkpoint's pickle runs no code;
what this model cannot hold is refused in one line before anything is written; a converted folder loads without the
package and in pipeline("translation"); converted models export to CTranslate2 with greedy token parity. The slow
tests: the published sizes (opus-mt-en-de, wmt19-en-de reduced, fairseq's transformer_wmt_en_de), and a converted
model fine-tuned with the cpu recipe, then exported to CTranslate2 with greedy token parity."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

from hf_vanilla_transformer.convert import ConversionError, convert_model
from hf_vanilla_transformer.convert.common import check_position_table
from hf_vanilla_transformer.model.modeling_vanilla_transformer import sinusoidal_positions

from conftest import FIXTURES, run_script, run_without_package
from convert_sources import (
    PAIRS,
    SENTENCES,
    bpe_codes,
    fairseq_arguments,
    fairseq_built_model,
    fairseq_dictionaries,
    fairseq_reference_ids,
    fairseq_state_dict,
    fsmt_source,
    fsmt_tokenizer_files,
    fsmt_twin,
    marian_source,
    marian_tokenizer_files,
    save_fairseq_checkpoint,
)


pytest.importorskip("sentencepiece")
sacremoses = pytest.importorskip("sacremoses")
pytest.importorskip("subword_nmt")

TOLERANCE = dict(rtol=0.0, atol=1e-5)


@pytest.fixture(scope="module")
def marian_tokenizer(tmp_path_factory):
    return marian_tokenizer_files(tmp_path_factory.mktemp("marian_tokenizer"))


@pytest.fixture(scope="module")
def codes() -> str:
    return bpe_codes()


@pytest.fixture(scope="module")
def fsmt_tokenizer(tmp_path_factory, codes):
    return fsmt_tokenizer_files(tmp_path_factory.mktemp("fsmt_tokenizer"), codes)


def teacher_forced(tokenizer, pairs, start: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """A padded batch of sources, and the targets shifted right behind `start` with their padding mask."""
    batch = tokenizer([source for source, _ in pairs], return_tensors="pt", padding=True)
    targets = tokenizer(text_target=[target for _, target in pairs], return_tensors="pt", padding=True)
    starts = torch.full((len(pairs), 1), start)
    decoder_ids = torch.cat([starts, targets["input_ids"][:, :-1]], dim=1)
    decoder_mask = torch.cat([torch.ones_like(starts), targets["attention_mask"][:, :-1]], dim=1)
    return dict(batch), decoder_ids, decoder_mask


def assert_same_logits(source_model, ours, batch, decoder_ids, decoder_mask, **source_kwargs) -> None:
    """The converted model's logits equal the source's at every real target position of a padded batch."""
    assert (batch["attention_mask"] == 0).any() and (decoder_mask == 0).any()  # padding on both sides
    with torch.no_grad():
        expected = source_model(
            **batch, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask, **source_kwargs
        ).logits
        logits = ours(**batch, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask).logits
    real = decoder_mask.bool()
    torch.testing.assert_close(logits[real], expected[real], **TOLERANCE)
    assert expected.abs().max() > 1.0  # not a comparison of near-zero outputs


def fairseq_targets(rows: int, length: int, vocab: int, cut: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random decoder inputs behind fairseq's start `</s>` (id 2), every other row padded (`<pad>` = 1) from `cut` on,
    and their mask."""
    decoder_ids = torch.randint(4, vocab, (rows, length), generator=torch.Generator().manual_seed(0))
    decoder_ids[:, 0] = 2
    decoder_mask = torch.ones_like(decoder_ids)
    decoder_mask[1::2, cut:] = 0
    decoder_ids[decoder_mask == 0] = 1
    return decoder_ids, decoder_mask


def assert_same_tokens(source_model, ours, batch, eos: int, **settings) -> None:
    """Greedy and 4-beam search give the source's tokens, each model with its own generation config (the source's
    decoding settings, converted); some sentences end before the length limit, at different lengths."""
    for beams in (1, 4):
        expected = source_model.generate(**batch, num_beams=beams, **settings)
        generated = ours.generate(**batch, num_beams=beams, **settings)
        assert torch.equal(generated, expected), (beams, generated, expected)
        lengths = (expected[:, 1:] == eos).int().argmax(dim=1)  # where each sentence's </s> is (0: none or first)
        assert len(set(lengths.tolist())) >= 3, (beams, expected)


# --- MarianMTModel ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def marian_converted(tmp_path_factory, marian_tokenizer):
    """A MarianMTModel folder as opus-mt-en-de's (small), and its conversion."""
    root = tmp_path_factory.mktemp("marian")
    marian = marian_source(root / "opus-mt-en-de", marian_tokenizer)
    return marian, convert_model(root / "opus-mt-en-de", root / "converted", source_id="Helsinki-NLP/opus-mt-en-de")


def test_a_marian_folder_converts_to_equal_logits_tokens_and_ids(tmp_path, marian_tokenizer, marian_converted):
    marian, output = marian_converted
    ours = AutoModelForSeq2SeqLM.from_pretrained(output).eval()
    config = ours.config
    assert (config.sinusoid_layout, config.activation_function, config.output_bias) == ("concat", "swish", True)
    pad = len(marian_tokenizer) - 1
    assert (config.pad_token_id, config.eos_token_id, config.decoder_start_token_id) == (pad, 0, pad)
    assert ours.lm_head.weight is ours.model.shared.weight is ours.model.encoder.embed_tokens.weight
    torch.testing.assert_close(ours.lm_head.bias, marian.final_logits_bias[0], rtol=0, atol=0)
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert type(tokenizer).__name__ == "MarianTokenizer"
    for source, target in SENTENCES:
        assert tokenizer(source)["input_ids"] == marian_tokenizer(source)["input_ids"]
        assert tokenizer(text_target=target)["input_ids"] == marian_tokenizer(text_target=target)["input_ids"]
    batch, decoder_ids, decoder_mask = teacher_forced(tokenizer, PAIRS[:8], start=pad)
    assert_same_logits(marian, ours, batch, decoder_ids, decoder_mask)
    assert_same_tokens(marian, ours, batch, eos=0)
    generation = json.loads((output / "generation_config.json").read_text())
    assert generation["max_length"] == 48 and generation["bad_words_ids"] == [[pad]]
    assert generation["length_penalty_type"] == "hf" and generation["relative_max_length"] is None
    card = (output / "README.md").read_text()
    assert "base_model: Helsinki-NLP/opus-mt-en-de" in card and str(tmp_path) not in card


def test_a_marian_folder_with_separate_embeddings_converts_to_equal_logits(tmp_path, marian_tokenizer):
    """`share_encoder_decoder_embeddings=False` (some opus-mt pairs): the source's embedding of its own."""
    marian = marian_source(tmp_path / "marian", marian_tokenizer, share_encoder_decoder_embeddings=False)
    ours = AutoModelForSeq2SeqLM.from_pretrained(convert_model(tmp_path / "marian", tmp_path / "out")).eval()
    assert ours.config.source_vocab_size == len(marian_tokenizer)
    torch.testing.assert_close(ours.model.encoder.embed_tokens.weight, marian.model.encoder.embed_tokens.weight)
    torch.testing.assert_close(ours.model.shared.weight, marian.model.decoder.embed_tokens.weight)
    assert not torch.equal(ours.model.encoder.embed_tokens.weight, ours.model.shared.weight)
    pad = len(marian_tokenizer) - 1
    batch, decoder_ids, decoder_mask = teacher_forced(marian_tokenizer, PAIRS[8:16], start=pad)
    assert_same_logits(marian, ours, batch, decoder_ids, decoder_mask)


def add_weights(folder: Path, weights: dict[str, torch.Tensor], drop: tuple[str, ...] = ()) -> Path:
    """`folder`'s model.safetensors with `weights` added (or replaced) and the names `drop` removed."""
    from safetensors.torch import load_file, save_file

    held = {name: tensor for name, tensor in load_file(folder / "model.safetensors").items() if name not in drop}
    save_file({**held, **weights}, folder / "model.safetensors")
    return folder


def position_tables(table: torch.Tensor) -> dict[str, torch.Tensor]:
    return {f"model.{stack}.embed_positions.weight": table.clone() for stack in ("encoder", "decoder")}


def test_marians_own_512_row_tables_are_its_sinusoids_and_convert(tmp_path, marian_tokenizer):
    """MarianMTModel tabulates its sinusoids in float64 and rounds them to float32 (opus-mt-en-de holds 512 x 512;
    wider models 512 x 1024). Ours are computed the same way: its own tables, built by its own code, equal ours to
    the last bit of float32 (float32 sinusoids differed by up to 2.9e-5, in 1,357 entries over 1e-5 at 512 x 512)
    and pass the check; so does one stored in float16; one entry altered by 1e-4 (learned positions) is refused,
    naming it."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    for width in (512, 1024):
        table = MarianSinusoidalPositionalEmbedding(512, width).create_weight()
        assert (sinusoidal_positions(torch.arange(512), width, "concat") - table).abs().max() <= 1.2e-7
        check_position_table(table, "concat", 0, width, "model.encoder.embed_positions.weight")
        check_position_table(table.half(), "concat", 0, width, "model.encoder.embed_positions.weight")
    marian_source(tmp_path / "source", marian_tokenizer, max_position_embeddings=512)
    table = MarianSinusoidalPositionalEmbedding(512, 32).create_weight()
    altered = table.clone()
    altered[300, 5] += 1e-4
    for name, rows in (("tabulated", table), ("half", table.half()), ("learned", altered)):
        shutil.copytree(tmp_path / "source", tmp_path / name)
        add_weights(tmp_path / name, position_tables(rows))
    ours = AutoModelForSeq2SeqLM.from_pretrained(convert_model(tmp_path / "tabulated", tmp_path / "out"))
    assert not any("embed_positions" in name for name in ours.state_dict())
    convert_model(tmp_path / "half", tmp_path / "half-out")
    message = r"encoder.embed_positions.weight is not the concat sinusoid table: row 300, column 5 differs by 0.0001"
    with pytest.raises(ConversionError, match=message) as error:
        convert_model(tmp_path / "learned", tmp_path / "refused")
    assert "\n" not in str(error.value) and not (tmp_path / "refused").exists()


def test_a_marian_model_gives_marians_logits_on_inputs_of_up_to_1000_tokens(tmp_path, marian_tokenizer):
    """Converted from a folder holding Marian's tables (1,024 rows), the model gives MarianMTModel's logits within
    1e-5 on padded sources of 1,000 and 900 tokens and targets of 960 and 700: its positions are Marian's at every
    position (float32 sinusoids drift with the position: 1.6e-5 in these logits)."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    marian = marian_source(tmp_path / "marian", marian_tokenizer, max_position_embeddings=1024)
    add_weights(tmp_path / "marian", position_tables(MarianSinusoidalPositionalEmbedding(1024, 32).create_weight()))
    ours = AutoModelForSeq2SeqLM.from_pretrained(convert_model(tmp_path / "marian", tmp_path / "out")).eval()
    pad = len(marian_tokenizer) - 1
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, pad, (2, 1000), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 900:] = 0
    ids[mask == 0] = pad
    ids[torch.arange(2), mask.sum(1) - 1] = 0  # </s>
    decoder_ids = torch.randint(1, pad, (2, 960), generator=generator)
    decoder_ids[:, 0] = pad  # Marian starts from <pad>
    decoder_mask = torch.ones_like(decoder_ids)
    decoder_mask[0, 700:] = 0
    decoder_ids[decoder_mask == 0] = pad
    assert_same_logits(marian, ours, {"input_ids": ids, "attention_mask": mask}, decoder_ids, decoder_mask)


# --- FSMT ------------------------------------------------------------------------------------------------------------


def test_an_fsmt_folder_converts_to_equal_logits_tokens_and_ids(tmp_path, fsmt_tokenizer):
    fsmt = fsmt_source(tmp_path / "wmt19-en-de", fsmt_tokenizer)
    output = convert_model(tmp_path / "wmt19-en-de", tmp_path / "converted")
    ours = AutoModelForSeq2SeqLM.from_pretrained(output).eval()
    config = ours.config
    assert config.sinusoid_layout == "fairseq" and config.decoder_start_token_id == 2
    assert config.source_vocab_size == fsmt_tokenizer.src_vocab_size and not config.tie_word_embeddings
    embeddings = (ours.model.encoder.embed_tokens.weight, ours.model.shared.weight, ours.lm_head.weight)
    assert len({tensor.data_ptr() for tensor in embeddings}) == 3  # three matrices, as the source's
    tokenizer = AutoTokenizer.from_pretrained(output)
    for source, _ in SENTENCES[::4]:  # FSMT's own tokenizer, saved again: a sample of the sentences
        assert tokenizer(source)["input_ids"] == fsmt_tokenizer(source)["input_ids"]
    batch = dict(tokenizer([source for source, _ in PAIRS[:8]], return_tensors="pt", padding=True))
    decoder_ids = torch.randint(4, config.vocab_size, (8, 11), generator=torch.Generator().manual_seed(0))
    decoder_ids[:, 0] = 2
    decoder_mask = torch.ones_like(decoder_ids)
    decoder_mask[::2, 7:] = 0
    decoder_ids[decoder_mask == 0] = 1
    assert_same_logits(fsmt, ours, batch, decoder_ids, decoder_mask, use_cache=False)
    assert_same_tokens(fsmt, ours, batch, eos=2, suppress_tokens=[1])  # (never <pad>: FSMT's position of a pad differs)
    generation = json.loads((output / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"], generation["max_length"]) == (5, 1.1, 48)


# --- fairseq ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fairseq_folder(tmp_path_factory, codes):
    """A fairseq model folder as its archives unpack: model.pt, dict.en.txt, dict.de.txt, bpecodes."""
    folder = tmp_path_factory.mktemp("fairseq") / "wmt16.en-de.transformer"
    symbols = fairseq_dictionaries(folder, codes)
    sizes = (len(symbols["en"]), len(symbols["de"]))
    args = fairseq_arguments()
    state = fairseq_state_dict(args, sizes)
    save_fairseq_checkpoint(folder / "model.pt", args, state)
    return folder, args, state, symbols


def test_a_fairseq_checkpoint_converts_to_fsmts_logits_and_tokens_and_fairseqs_ids(tmp_path, fairseq_folder, codes):
    """fairseq itself does not install here (Python 3.11; docs/converting.md): the mapping is proven through FSMT,
    fairseq's model in transformers, holding the same state dict; the tokenizer against fairseq's own pipeline
    (sacremoses, subword-nmt, the dictionary)."""
    folder, args, state, symbols = fairseq_folder
    sizes = (len(symbols["en"]), len(symbols["de"]))
    output = convert_model(folder, tmp_path / "converted")
    ours = AutoModelForSeq2SeqLM.from_pretrained(output).eval()
    assert (ours.config.source_vocab_size, ours.config.vocab_size) == sizes
    assert ours.lm_head.weight is ours.model.shared.weight  # share_decoder_input_output_embed
    tokenizer = AutoTokenizer.from_pretrained(output)
    detokenizer = sacremoses.MosesDetokenizer(lang="de")
    for source, target in SENTENCES:
        assert tokenizer(source)["input_ids"] == fairseq_reference_ids(source, "en", codes, symbols["en"]), source
        # fairseq decodes target ids by its dictionary, joins the BPE pieces and detokenizes with Moses.
        ids = fairseq_reference_ids(target, "de", codes, symbols["de"])
        if 3 not in ids:
            pieces = " ".join(symbols["de"][i] for i in ids[:-1]).replace("@@ ", "")
            assert tokenizer.decode(ids, skip_special_tokens=True) == detokenizer.detokenize(pieces.split()), target
    twin = fsmt_twin(args, state, sizes)
    batch = dict(tokenizer([source for source, _ in PAIRS[:8]], return_tensors="pt", padding=True))
    decoder_ids, decoder_mask = fairseq_targets(8, 11, sizes[1], cut=6)
    assert_same_logits(twin, ours, batch, decoder_ids, decoder_mask, use_cache=False)
    generation = {key: value for key, value in json.loads((output / "generation_config.json").read_text()).items()}
    assert generation["suppress_tokens"] == [1] and generation["max_length"] == 202
    settings = dict(max_length=40, min_length=2, suppress_tokens=[1], forced_eos_token_id=2, early_stopping=True)
    assert_same_tokens(twin, ours, batch, eos=2, **settings)


def test_an_older_fairseq_layout_converts_to_the_same_model(tmp_path, fairseq_folder):
    """fairseq before 0.7: each attention's q, k, v in one `in_proj_weight`, LayerNorms as `layer_norms.N`."""
    folder, args, state, _ = fairseq_folder
    old = {}
    for name, tensor in state.items():
        if any(f".{p}_proj." in name for p in "qkv"):
            stem, kind = name.rsplit(".", 2)[0], name.rsplit(".", 1)[1]
            if name.endswith(f"q_proj.{kind}"):
                parts = [state[f"{stem}.{p}_proj.{kind}"] for p in "qkv"]
                old[f"{stem}.in_proj_{kind}"] = torch.cat(parts)
            continue
        for index, norm in enumerate(("self_attn_layer_norm", "final_layer_norm")):
            if name.startswith("encoder.") and f".{norm}." in name:
                name = name.replace(f".{norm}.", f".layer_norms.{index}.")
        old[name] = tensor
    old_folder = tmp_path / "old"
    old_folder.mkdir()
    for file in ("dict.en.txt", "dict.de.txt", "bpecodes"):
        (old_folder / file).write_bytes((folder / file).read_bytes())
    save_fairseq_checkpoint(old_folder / "checkpoint_best.pt", args, old)
    first = AutoModelForSeq2SeqLM.from_pretrained(convert_model(folder, tmp_path / "new_out"))
    second = AutoModelForSeq2SeqLM.from_pretrained(convert_model(old_folder, tmp_path / "old_out"))
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


class CallsSomething:
    """What a malicious or careless checkpoint can hold: a pickle that calls a function when it is loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_a_pickle_naming_another_callable_is_refused_and_runs_nothing(tmp_path, fairseq_folder):
    folder, args, state, _ = fairseq_folder
    evil = tmp_path / "evil"
    evil.mkdir()
    for file in ("dict.en.txt", "dict.de.txt", "bpecodes"):
        (evil / file).write_bytes((folder / file).read_bytes())
    marker = tmp_path / "it-ran"
    save_fairseq_checkpoint(evil / "model.pt", args, state, hook=CallsSomething(marker))
    with pytest.raises(ConversionError, match=r"names posix\.mkdir in its pickle.*refused without running it") as error:
        convert_model(evil, tmp_path / "out")
    assert "\n" not in str(error.value)
    assert not marker.exists() and not (tmp_path / "out").exists()


# --- What this model cannot hold: refused in one line, nothing written -----------------------------------------------


def fairseq_variant(folder: Path, source: Path, args, state, drop: tuple[str, ...] = (), **arguments) -> Path:
    """A copy of the fairseq folder `source` whose checkpoint's arguments differ by `arguments`, without `drop`."""
    folder.mkdir()
    for file in ("dict.en.txt", "dict.de.txt", "bpecodes"):
        (folder / file).write_bytes((source / file).read_bytes())
    changed = {key: value for key, value in {**vars(args), **arguments}.items() if key not in drop}
    return save_fairseq_checkpoint(folder / "model.pt", type(args)(**changed), state)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (dict(encoder_normalize_before=True), r"encoder_normalize_before=True: this model cannot hold pre-LN encoder"),
        (dict(encoder_normalize_before="True"), r"encoder_normalize_before='True': this model cannot hold pre-LN"),
        (dict(decoder_learned_pos=True), r"decoder_learned_pos=True: this model cannot hold learned positions"),
        (dict(arch="lstm_wiseman_iwslt_de_en"), r"arch='lstm_wiseman_iwslt_de_en' is not one of fairseq's transformer"),
        (dict(layernorm_embedding=1), r"layernorm_embedding=1: this model cannot hold a LayerNorm on the embeddings"),
        (dict(scale_attn=True), r"scale_attn=True: this model cannot hold NormFormer's extra LayerNorms"),
        (dict(encoder_layers_to_keep="0,1"), r"encoder_layers_to_keep='0,1': this model cannot hold pruned layers"),
        (dict(share_all_embeddings="maybe"), r"share_all_embeddings='maybe' is not a boolean; expected True or False"),
        (dict(activation_fn="swish"), r"activation_fn='swish': this model has \["),
        (dict(target_lang="fr"), r"no dictionary dict\.fr\.txt beside the checkpoint"),
        (dict(target_lang="/../../x"), r"target_lang='/\.\./\.\./x' is not a language code such as 'en'"),
        (dict(tokenizer="space"), r"tokenizer='space': the converted tokenizer runs fairseq's \('moses',\) only"),
        (dict(bpe="sentencepiece"), r"bpe='sentencepiece': the converted tokenizer applies fairseq's \('subword_nmt'"),
        (dict(bpe="subword_nmt", bpe_separator="##"), r"bpe_separator='##': FSMT's BPE marks pieces with '@@' only"),
    ],
)
def test_a_fairseq_option_this_model_lacks_is_refused_in_one_line(tmp_path, fairseq_folder, arguments, message):
    folder, args, state, _ = fairseq_folder
    fairseq_variant(tmp_path / "variant", folder, args, state, **arguments)
    with pytest.raises(ConversionError, match=message) as error:
        convert_model(tmp_path / "variant", tmp_path / "out")
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()
    assert [path.name for path in tmp_path.iterdir()] == ["variant"]  # no partial folder left either


def test_other_sources_and_a_used_output_folder_are_refused_in_one_line(tmp_path, marian_tokenizer):
    marian_source(tmp_path / "marian", marian_tokenizer)
    config = json.loads((tmp_path / "marian" / "config.json").read_text())
    cases = {
        "bart": ({**config, "model_type": "bart"}, r"model_type 'bart'; expected a MarianMTModel \('marian'\) or FSMT"),
        "prenorm": ({**config, "normalize_before": True}, r"normalize_before=True: this model has no pre-LN layers"),
        "layernorm": ({**config, "normalize_embedding": True}, r"normalize_embedding=True: .* LayerNorm on the emb"),
    }
    for name, (changed, message) in cases.items():
        (tmp_path / name).mkdir()
        for file in (tmp_path / "marian").iterdir():
            (tmp_path / name / file.name).write_bytes(file.read_bytes())
        (tmp_path / name / "config.json").write_text(json.dumps(changed))
        with pytest.raises(ConversionError, match=message):
            convert_model(tmp_path / name, tmp_path / f"{name}-out")
        assert not (tmp_path / f"{name}-out").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    with pytest.raises(ConversionError, match="exists and is not an empty folder"):
        convert_model(tmp_path / "marian", tmp_path / "used")
    (tmp_path / "no-tokenizer").mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        (tmp_path / "no-tokenizer" / name).write_bytes((tmp_path / "marian" / name).read_bytes())
    with pytest.raises(ConversionError, match=r"no MarianTokenizer in no-tokenizer: source\.spm, target\.spm"):
        convert_model(tmp_path / "no-tokenizer", tmp_path / "out")
    with pytest.raises(ConversionError, match="does not exist"):
        convert_model(tmp_path / "nowhere", tmp_path / "out")
    with pytest.raises(ConversionError, match=r"source_id='a/b\\nlicense: mit' is invalid; expected a Hub id"):
        convert_model(tmp_path / "marian", tmp_path / "out", source_id="a/b\nlicense: mit")  # into the card's YAML
    assert not (tmp_path / "out").exists()


def test_fairseq_flags_held_as_text_are_read_as_booleans_everywhere(tmp_path, fairseq_folder):
    """fairseq's oldest checkpoints hold flags as text: "False" is False for the sharing of the embeddings and the
    output projection, for the scaling and for the options refused. A checkpoint with an output projection of its
    own and every flag "False" gives its FSMT twin's logits (with "False" read as True it was refused as sharing
    one embedding for two different matrices, or converted without scaling)."""
    folder, args, state, symbols = fairseq_folder
    sizes = (len(symbols["en"]), len(symbols["de"]))
    own = dict(state)
    noise = torch.randn(own["decoder.embed_tokens.weight"].shape, generator=torch.Generator().manual_seed(1))
    own["decoder.output_projection.weight"] = own["decoder.embed_tokens.weight"] + 0.2 * noise
    flags = ("share_decoder_input_output_embed", "share_all_embeddings", "no_scale_embedding", "layernorm_embedding")
    flags += ("encoder_normalize_before", "decoder_normalize_before", "encoder_learned_pos", "adaptive_input")
    fairseq_variant(tmp_path / "text", folder, args, own, **dict.fromkeys(flags, "False"))
    ours = AutoModelForSeq2SeqLM.from_pretrained(convert_model(tmp_path / "text", tmp_path / "out")).eval()
    assert ours.config.scale_embedding and not ours.config.tie_word_embeddings
    assert ours.config.source_vocab_size == sizes[0]
    twin = fsmt_twin(args, own, sizes)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    batch = dict(tokenizer([source for source, _ in PAIRS[:4]], return_tensors="pt", padding=True))
    assert_same_logits(twin, ours, batch, *fairseq_targets(4, 9, sizes[1], cut=6), use_cache=False)


def test_an_architecture_whose_defaults_this_model_lacks_is_refused_by_name(tmp_path, fairseq_folder):
    """`transformer_wmt_en_de_big_t2t` is pre-LN unless its arguments say otherwise: refused by its name where the
    checkpoint leaves the LayerNorms' place to the architecture, converted where it says post-LN."""
    folder, args, state, _ = fairseq_folder
    drop = ("encoder_normalize_before", "decoder_normalize_before")
    fairseq_variant(tmp_path / "t2t", folder, args, state, drop=drop, arch="transformer_wmt_en_de_big_t2t")
    message = r"arch='transformer_wmt_en_de_big_t2t' \(its default encoder_normalize_before=True\): this model cannot"
    with pytest.raises(ConversionError, match=message):
        convert_model(tmp_path / "t2t", tmp_path / "out")
    fairseq_variant(tmp_path / "t2t-post-ln", folder, args, state, arch="transformer_wmt_en_de_big_t2t")
    convert_model(tmp_path / "t2t-post-ln", tmp_path / "post-ln-out")


def layer_copy(state: dict, stack: str, source: int, target: int) -> dict:
    prefix = f"{stack}.layers.{source}."
    return {f"{stack}.layers.{target}.{n[len(prefix) :]}": t for n, t in state.items() if n.startswith(prefix)}


@pytest.mark.parametrize(
    ("extra", "arguments", "message"),
    [
        (dict.fromkeys(("encoder.layer_norm.weight", "encoder.layer_norm.bias")), {}, "encoder.layer_norm.bias, enc"),
        (dict.fromkeys(("decoder.layernorm_embedding.weight",)), {}, ": decoder.layernorm_embedding.weight$"),
        (dict.fromkeys(("encoder.layers.0.self_attn.c_attn",)), {}, ": encoder.layers.0.self_attn.c_attn$"),
        (dict.fromkeys(("decoder.embed_positions.weight",)), {}, ": decoder.embed_positions.weight$"),
        ("encoder layer 2", {}, r"the weights hold 3 \+ 2 layers; the arguments say 2 \+ 2"),
        ({}, dict(decoder_layers=3), r"the weights hold 2 \+ 2 layers; the arguments say 2 \+ 3"),
        ({}, dict(embed_dim=64), r"the encoder embedding is 32 wide but the arguments say encoder_embed_dim=64"),
    ],
)
def test_a_fairseq_weight_the_mapping_does_not_take_is_refused_by_name(
    tmp_path, fairseq_folder, extra, arguments, message
):
    """A LayerNorm after the stack (pre-LN) or on the embeddings, NormFormer's head scales, learned positions, a layer
    beyond the arguments' count: refused in one line naming the weights, not left out; the layer counts and the
    embeddings' width are checked against the weights. (The version counters and the placeholder buffer of the
    fixture's positions are bookkeeping: the fixture converts.)"""
    folder, args, state, _ = fairseq_folder
    width = args.encoder_embed_dim
    if extra == "encoder layer 2":
        extra = layer_copy(state, "encoder", 1, 2)
    extra = {name: torch.ones(width) if tensor is None else tensor for name, tensor in extra.items()}
    if "embed_dim" in arguments:
        arguments = dict(encoder_embed_dim=64, decoder_embed_dim=64, decoder_output_dim=64, decoder_input_dim=64)
    folder_out = tmp_path / "variant"
    fairseq_variant(folder_out, folder, args, {**state, **extra}, **arguments)
    with pytest.raises(ConversionError, match=message) as error:
        convert_model(folder_out, tmp_path / "out")
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()


def test_a_marian_or_fsmt_weight_the_mapping_does_not_take_is_refused_by_name(
    tmp_path, marian_tokenizer, fsmt_tokenizer
):
    """Each family's weights the mapping leaves are refused by name: a LayerNorm on Marian's embeddings, a tied
    output projection that is not the shared matrix, a LayerNorm after FSMT's encoder."""
    marian_source(tmp_path / "marian", marian_tokenizer)
    fsmt_source(tmp_path / "fsmt", fsmt_tokenizer)
    cases = {
        "marian": ({"model.encoder.layernorm_embedding.weight": torch.ones(32)}, "model.encoder.layernorm_embedding"),
        "fsmt": ({"model.encoder.layer_norm.weight": torch.ones(32)}, r"no place for: encoder.layer_norm.weight$"),
    }
    for family, (extra, message) in cases.items():
        shutil.copytree(tmp_path / family, tmp_path / f"{family}-extra")
        add_weights(tmp_path / f"{family}-extra", extra)
        with pytest.raises(ConversionError, match=message.removeprefix("model.")):
            convert_model(tmp_path / f"{family}-extra", tmp_path / f"{family}-out")
    shutil.copytree(tmp_path / "marian", tmp_path / "untied")
    add_weights(tmp_path / "untied", {"lm_head.weight": torch.zeros(len(marian_tokenizer), 32)})
    with pytest.raises(ConversionError, match=r"lm_head.weight differs from shared.weight, but tie_word_embeddings is"):
        convert_model(tmp_path / "untied", tmp_path / "untied-out")


def test_fairseqs_text_pipeline_is_read_from_the_checkpoint_and_honoured(tmp_path, fairseq_folder, codes):
    """`--tokenizer moses --moses-no-dash-splits --moses-no-escape --bpe subword_nmt --bpe-codes .../codes.en-de`, as
    fairseq 0.9 records them (flat arguments, a flag as text) and as fairseq 0.10 and later do (`cfg` sections): the
    converted tokenizer runs Moses with those flags and the codes of that name, giving fairseq's ids, which differ
    from those of Moses' defaults. A checkpoint that names no tokenizer says in its card what was assumed."""
    folder, args, state, symbols = fairseq_folder
    flat = dict(tokenizer="moses", moses_no_dash_splits=True, moses_no_escape="True", bpe="subword_nmt")
    fairseq_variant(tmp_path / "flat", folder, args, state, **flat, bpe_codes="/train/data/codes.en-de")
    sections = {
        "tokenizer": dict(_name="moses", source_lang="en", target_lang="de", moses_no_dash_splits=True),
        "bpe": dict(_name="subword_nmt", bpe_codes="/train/data/codes.en-de", bpe_separator="@@"),
    }
    shutil.copytree(tmp_path / "flat", tmp_path / "cfg")
    sections["tokenizer"]["moses_no_escape"] = True
    save_fairseq_checkpoint(tmp_path / "cfg" / "model.pt", args, state, sections=sections)
    sentences = ['The e-mail\'s "subject" & body-text.', "Use drag-and-drop <here>.", *(s for s, _ in SENTENCES[:40])]
    for variant in ("flat", "cfg"):
        (tmp_path / variant / "bpecodes").rename(tmp_path / variant / "codes.en-de")
        tokenizer = AutoTokenizer.from_pretrained(convert_model(tmp_path / variant, tmp_path / f"{variant}-out"))
        for sentence in sentences:
            expected = fairseq_reference_ids(sentence, "en", codes, symbols["en"], dash_splits=False, escape=False)
            assert tokenizer(sentence)["input_ids"] == expected, (variant, sentence)
        card = (tmp_path / f"{variant}-out" / "README.md").read_text()
        assert "assumed" not in card
    defaults = [fairseq_reference_ids(sentence, "en", codes, symbols["en"]) for sentence in sentences[:2]]
    assert [tokenizer(sentence)["input_ids"] for sentence in sentences[:2]] != defaults
    assert (
        "tokenizer: the checkpoint names none" in (convert_model(folder, tmp_path / "plain") / "README.md").read_text()
    )


# --- Nothing of the source's code travels ----------------------------------------------------------------------------

HOSTILE_AUTO_MAP = {"AutoTokenizer": ["owner/repo--module.Class", None]}


def hostile_tokenizer_config(folder: Path, **changes) -> None:
    """`folder`'s tokenizer_config.json naming code of another repository (`auto_map`), a key no tokenizer defines,
    a local path, a chat template, and `changes`."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config |= dict(auto_map=HOSTILE_AUTO_MAP, owner_setting=1, name_or_path="/home/someone/secret")
    path.write_text(json.dumps({**config, "chat_template": "{{ messages }}", **changes}))


def test_a_hostile_source_folder_hands_nothing_of_its_code_to_the_converted_one(
    tmp_path, marian_tokenizer, fsmt_tokenizer, fairseq_folder
):
    """A source whose tokenizer_config.json names another repository's code (`auto_map`, which the card's
    `trust_remote_code=True` would run), keys no tokenizer class defines, and languages that would write YAML of
    their own into the card: the converted folder's tokenizer config keeps only its class's keys, names the source's
    own transformers class, holds no auto_map (a fairseq one: this package's tokenizer only), and the card's metadata
    holds each language as one value."""
    from huggingface_hub import ModelCard

    from hf_vanilla_transformer.data.tokenizer import tokenizer_keys

    marian_source(tmp_path / "marian", marian_tokenizer)
    hostile = "en\nlicense: mit\nbase_model: owner/repo"
    hostile_tokenizer_config(tmp_path / "marian", source_lang=hostile, target_lang="de\n---\n# Heading")
    fsmt_source(tmp_path / "fsmt", fsmt_tokenizer)
    hostile_tokenizer_config(tmp_path / "fsmt")
    for family, name in (("marian", "MarianTokenizer"), ("fsmt", "FSMTTokenizer")):
        output = convert_model(tmp_path / family, tmp_path / f"{family}-out")
        config = json.loads((output / "tokenizer_config.json").read_text())
        assert "auto_map" not in config and config["tokenizer_class"] == name, config
        assert set(config) <= tokenizer_keys(type(AutoTokenizer.from_pretrained(output))), config
        assert not {"owner_setting", "name_or_path", "chat_template"} & set(config)
        assert not (output / "chat_template.jinja").exists()
        assert set(json.loads((output / "config.json").read_text())["auto_map"].values()) == {
            "configuration_vanilla_transformer.VanillaTransformerConfig",
            "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
        }
    card = ModelCard((tmp_path / "marian-out" / "README.md").read_text())
    assert card.data.language == [hostile, "de\n---\n# Heading"]
    assert card.data.license is None and card.data.base_model is None
    fairseq = convert_model(fairseq_folder[0], tmp_path / "fairseq-out")
    config = json.loads((fairseq / "tokenizer_config.json").read_text())
    own = "tokenization_vanilla_transformer.VanillaTransformerFairseqTokenizer"
    assert config["auto_map"] == {"AutoTokenizer": [own, None]}
    assert config["tokenizer_class"] == "VanillaTransformerFairseqTokenizer"


def test_a_sharded_folder_reads_its_own_shards_only(tmp_path, marian_tokenizer):
    """A sharded MarianMTModel folder converts to the weights of the whole one; an index naming a shard outside the
    folder (a path up, an absolute path, a link out) is refused in one line naming it, and that file is not read."""
    marian = marian_source(tmp_path / "whole", marian_tokenizer)
    shutil.copytree(tmp_path / "whole", tmp_path / "sharded")
    (tmp_path / "sharded" / "model.safetensors").unlink()
    marian.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    whole = AutoModelForSeq2SeqLM.from_pretrained(convert_model(tmp_path / "whole", tmp_path / "whole-out"))
    sharded = AutoModelForSeq2SeqLM.from_pretrained(convert_model(tmp_path / "sharded", tmp_path / "sharded-out"))
    for (name, tensor), other in zip(whole.state_dict().items(), sharded.state_dict().values(), strict=True):
        assert torch.equal(tensor, other), name
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    outside = tmp_path / "outside.safetensors"
    shutil.copy(tmp_path / "sharded" / shard, outside)
    (tmp_path / "sharded" / "link.safetensors").symlink_to(outside)
    for escape in ("../outside.safetensors", str(outside), "link.safetensors"):
        shutil.copytree(tmp_path / "sharded", tmp_path / "escape", symlinks=True)
        changed = {name: escape if file == shard else file for name, file in index["weight_map"].items()}
        (tmp_path / "escape" / "model.safetensors.index.json").write_text(json.dumps({**index, "weight_map": changed}))
        with pytest.raises(
            ConversionError, match=rf"names the shard '{re.escape(escape)}', which is not a file of esc"
        ):
            convert_model(tmp_path / "escape", tmp_path / "escape-out")
        shutil.rmtree(tmp_path / "escape")


# --- A converted folder in the package's flows -----------------------------------------------------------------------


def test_the_convert_command_writes_a_folder_that_loads_without_the_package(tmp_path, fairseq_folder):
    """`vanilla-transformer convert` on a fairseq folder; the result loads in a process where this package cannot be
    imported (model and tokenizer by `trust_remote_code=True`) and gives the same ids and logits."""
    from hf_vanilla_transformer.commands.cli import main

    folder, *_ = fairseq_folder
    main(["convert", str(folder), str(tmp_path / "converted")])
    with pytest.raises(SystemExit, match="vanilla-transformer convert: .* exists and is not an empty folder"):
        main(["convert", str(folder), str(tmp_path / "converted")])
    ours = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "converted").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "converted")
    batch = tokenizer([source for source, _ in PAIRS[:3]], return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = ours(**batch, decoder_input_ids=batch["input_ids"][:, :5].clamp(max=50)).logits
    torch.save({"logits": expected, "ids": batch["input_ids"]}, tmp_path / "expected.pt")
    result = run_without_package(
        f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        folder = {str(tmp_path / "converted")!r}
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        batch = tokenizer({[source for source, _ in PAIRS[:3]]!r}, return_tensors="pt", padding=True)
        with torch.no_grad():
            logits = model(**batch, decoder_input_ids=batch["input_ids"][:, :5].clamp(max=50)).logits
        torch.save({{"logits": logits, "ids": batch["input_ids"], "class": type(tokenizer).__module__}}, "got.pt")
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got, wanted = torch.load(tmp_path / "got.pt"), torch.load(tmp_path / "expected.pt")
    assert got["class"].startswith("transformers_modules")  # the folder's own tokenizer file
    assert torch.equal(got["ids"], wanted["ids"])
    torch.testing.assert_close(got["logits"], wanted["logits"], rtol=0, atol=0)


def test_a_converted_marian_model_translates_in_the_pipeline(marian_tokenizer, marian_converted):
    marian, output = marian_converted
    translator = pipeline("translation", model=str(output))
    sources = [source for source, _ in PAIRS[:4]]
    expected = marian.generate(**marian_tokenizer(sources, return_tensors="pt", padding=True), num_beams=2)
    texts = marian_tokenizer.batch_decode(expected, skip_special_tokens=True)
    assert [result["translation_text"] for result in translator(sources, num_beams=2)] == [t.strip() for t in texts]


@pytest.mark.slow
def test_a_converted_model_fine_tunes_with_the_cpu_recipe_and_exports_to_ctranslate2(tmp_path, marian_tokenizer):
    """A converted Marian model trains with `vanilla-transformer train --recipe cpu --model_name_or_path` (its own
    tokenizer, a few updates), and its CTranslate2 export decodes greedily the tokens `generate()` gives."""
    pytest.importorskip("ctranslate2")
    from hf_vanilla_transformer.deploy.ctranslate2 import CTranslate2Translator, export_ctranslate2

    marian_source(tmp_path / "opus-mt-en-de", marian_tokenizer, dropout=0.0)
    converted = convert_model(tmp_path / "opus-mt-en-de", tmp_path / "converted")
    fixtures = FIXTURES
    result = run_script(
        "train.py",
        *("--recipe", "cpu", "--model_name_or_path", converted, "--max_steps", "6", "--output_dir", tmp_path / "run"),
        *("--data_files", fixtures / "libreoffice_help_en_de_200.tsv", "--eval_strategy", "no"),
        *("--validation_files", fixtures / "libreoffice_help_en_de_test_40.tsv", "--max_eval_samples", "10"),
        *("--test_files", fixtures / "libreoffice_help_en_de_test_40.tsv", "--test_beams", "1"),
        *("--length_penalty_choices", "0.6", "--precision", "fp32", "--attn_implementation", "sdpa"),
        *("--data_cache_dir", tmp_path / "cache", "--disable_tqdm", "true"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["training"]["steps"] == 6
    tuned = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "run").eval()
    before = AutoModelForSeq2SeqLM.from_pretrained(converted)
    assert not torch.equal(tuned.model.shared.weight, before.model.shared.weight)  # it trained
    assert tuned.lm_head.bias is not None and not torch.equal(tuned.lm_head.bias, before.lm_head.bias)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run")
    assert type(tokenizer).__name__ == "MarianTokenizer"

    engine = CTranslate2Translator(export_ctranslate2(tmp_path / "run", tmp_path / "ct2"))
    sentences = [source for source, _ in SENTENCES[200:216]]
    results = engine.translator.translate_batch(engine.tokens(sentences), beam_size=1, max_decoding_length=20)
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    ours = tuned.generate(**batch, num_beams=1, max_new_tokens=20, forced_eos_token_id=None)
    specials = {tuned.config.pad_token_id, tuned.config.eos_token_id}
    for result, row in zip(results, ours, strict=True):
        assert result.hypotheses[0] == tokenizer.convert_ids_to_tokens([t for t in row.tolist() if t not in specials])
    # A random model's translations: of different lengths by source (not one output for every input).
    assert len({len(result.hypotheses[0]) for result in results}) >= 3


def test_a_converted_fairseq_model_with_a_joined_dictionary_exports_to_ctranslate2(tmp_path, codes, fsmt_tokenizer):
    """transformer.wmt16.en-de's layout: one dictionary and one embedding matrix for both languages
    (`share_all_embeddings`); its CTranslate2 export (fairseq's positions written out as a table, the fairseq
    tokenizer beside it) decodes greedily the tokens `generate()` gives. A source vocabulary of its own is refused."""
    pytest.importorskip("ctranslate2")
    from hf_vanilla_transformer.deploy.ctranslate2 import CTranslate2Translator, export_ctranslate2

    folder = tmp_path / "wmt16.en-de.joined-dict.transformer"
    symbols = fairseq_dictionaries(folder, codes, joined=True)
    args = fairseq_arguments(share_all_embeddings=True)
    state = fairseq_state_dict(args, (len(symbols["en"]), len(symbols["de"])))
    state["encoder.embed_tokens.weight"] = state["decoder.embed_tokens.weight"]
    save_fairseq_checkpoint(folder / "model.pt", args, state)
    converted = convert_model(folder, tmp_path / "converted")
    ours = AutoModelForSeq2SeqLM.from_pretrained(converted).eval()
    assert ours.config.source_vocab_size is None and ours.model.encoder.embed_tokens is ours.model.shared
    engine = CTranslate2Translator(export_ctranslate2(converted, tmp_path / "ct2"))
    tokenizer = engine.tokenizer
    sentences = [source for source, _ in SENTENCES[200:216]]
    results = engine.translator.translate_batch(engine.tokens(sentences), beam_size=1, max_decoding_length=30)
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    # fairseq's decoding (at least one token, never <pad>) is CTranslate2's greedy search; no </s> forced at the limit.
    generated = ours.generate(**batch, num_beams=1, max_new_tokens=30, forced_eos_token_id=None)
    for result, row in zip(results, generated, strict=True):
        tokens = row.tolist()[1:]
        tokens = tokens[: tokens.index(2)] if 2 in tokens else tokens  # up to </s>, which CTranslate2 leaves out
        assert result.hypotheses[0] == tokenizer.convert_ids_to_tokens(tokens)
    assert len({len(result.hypotheses[0]) for result in results}) >= 3
    fsmt_source(tmp_path / "fsmt", fsmt_tokenizer)
    separate = convert_model(tmp_path / "fsmt", tmp_path / "fsmt-converted")
    with pytest.raises(ValueError, match=r"source_vocab_size=\d+: a source vocabulary of its own .* not exported"):
        export_ctranslate2(separate, tmp_path / "fsmt-ct2")


# --- fairseq itself (slow, where fairseq-fixed is installed) ---------------------------------------------------------


@pytest.mark.slow
def test_a_checkpoint_fairseq_wrote_converts_to_fairseqs_ids_logits_and_beam_tokens(tmp_path, codes):
    """fairseq's own code end to end (`fairseq-fixed`, fairseq 0.12 kept for Python 3.11: an optional test dependency,
    docs/converting.md): a small `transformer_wmt_en_de` built by fairseq's parser, task and model builder and saved
    by its Trainer's checkpoint code with `--tokenizer moses --bpe subword_nmt`, read from its `cfg` sections. The
    converted tokenizer gives the ids of fairseq's own tokenizer, BPE and dictionary; the converted model gives
    fairseq's logits within 1e-5 on a padded batch (fairseq pads sources on the left) and the tokens of fairseq's own
    `SequenceGenerator` with beam 4 under fairseq-generate's other defaults."""
    pytest.importorskip("fairseq", reason="fairseq-fixed is not installed (docs/converting.md: an optional check)")
    from fairseq.data import data_utils, encoders
    from fairseq.sequence_generator import SequenceGenerator

    folder = tmp_path / "fairseq"
    task, fairseq_model, cfg = fairseq_built_model(folder, codes)
    output = convert_model(folder / "checkpoint_last.pt", tmp_path / "out")
    ours = AutoModelForSeq2SeqLM.from_pretrained(output).eval()
    tokenizer = AutoTokenizer.from_pretrained(output)
    moses, bpe = encoders.build_tokenizer(cfg.tokenizer), encoders.build_bpe(cfg.bpe)
    source_dict, target_dict = task.source_dictionary, task.target_dictionary

    def fairseq_ids(text: str, dictionary) -> torch.Tensor:
        return dictionary.encode_line(bpe.encode(moses.encode(text)), add_if_not_exist=False, append_eos=True).long()

    for source, _ in SENTENCES:
        assert tokenizer(source)["input_ids"] == fairseq_ids(source, source_dict).tolist(), source
    pairs = PAIRS[:8]
    sources = [fairseq_ids(source, source_dict) for source, _ in pairs]
    targets = [fairseq_ids(target, target_dict) for _, target in pairs]
    pad, eos = source_dict.pad(), source_dict.eos()
    left_padded = data_utils.collate_tokens(sources, pad, eos, left_pad=True)
    lengths = torch.tensor([len(ids) for ids in sources])
    previous = data_utils.collate_tokens(targets, pad, eos, left_pad=False, move_eos_to_beginning=True)
    with torch.no_grad():
        expected = fairseq_model(left_padded, lengths, previous)[0]
    batch = dict(tokenizer([source for source, _ in pairs], return_tensors="pt", padding=True))
    decoder_mask = (previous != pad).long()
    assert (batch["attention_mask"] == 0).any() and (decoder_mask == 0).any()
    with torch.no_grad():
        logits = ours(**batch, decoder_input_ids=previous, decoder_attention_mask=decoder_mask).logits
    real = decoder_mask.bool()
    torch.testing.assert_close(logits[real], expected[real], **TOLERANCE)
    generator = SequenceGenerator([fairseq_model], target_dict, beam_size=4, max_len_b=200, min_len=1)
    with torch.no_grad():
        hypotheses = generator.generate(
            [fairseq_model], {"net_input": {"src_tokens": left_padded, "src_lengths": lengths}}
        )
    generated = ours.generate(**batch, num_beams=4)
    for row, hypothesis in zip(generated, hypotheses, strict=True):
        tokens = hypothesis[0]["tokens"].tolist()  # fairseq's best, ending with </s>, without the start
        assert row[1 : len(tokens) + 1].tolist() == tokens
    assert len({len(hypothesis[0]["tokens"]) for hypothesis in hypotheses}) >= 3


# --- The published sizes (slow) --------------------------------------------------------------------------------------


def random_batch(vocab: int, pad: int, sentences: int = 4, length: int = 21, seed: int = 0) -> dict:
    """Sentences of random real tokens (none special), right-padded to different lengths, ending with </s>."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab - 1, (sentences, length), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(1, sentences):
        mask[row, length - 3 * row :] = 0
    return ids, mask


@pytest.mark.slow
def test_opus_mt_en_de_sized_marian_converts_to_equal_logits_and_tokens(tmp_path, marian_tokenizer):
    """opus-mt-en-de's configuration: d_model 512, 6 + 6 layers, 8 heads, d_ff 2048, swish, 58,101 tokens."""
    sizes = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8)
    sizes |= dict(encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512, vocab_size=58101)
    marian = marian_source(tmp_path / "opus-mt-en-de", marian_tokenizer, **sizes)
    ours = AutoModelForSeq2SeqLM.from_pretrained(convert_model(tmp_path / "opus-mt-en-de", tmp_path / "out")).eval()
    ids, mask = random_batch(58101, pad=58100)
    ids[mask == 0] = 58100
    ids[torch.arange(4), mask.sum(1) - 1] = 0  # </s>
    decoder_ids = torch.cat([torch.full((4, 1), 58100), ids[:, :-1]], dim=1)
    assert_same_logits(marian, ours, {"input_ids": ids, "attention_mask": mask}, decoder_ids, mask)
    batch = {"input_ids": ids, "attention_mask": mask}
    for beams in (1, 4):
        expected = marian.generate(**batch, num_beams=beams, max_length=40)
        assert torch.equal(ours.generate(**batch, num_beams=beams, max_length=40), expected)


@pytest.mark.slow
def test_wmt19_en_de_sized_fsmt_at_reduced_depth_and_width_converts_to_equal_logits_and_tokens(
    tmp_path, fsmt_tokenizer
):
    """wmt19-en-de's vocabularies (42,024 each, separate) and settings, at 3 + 3 layers of d_model 256 (of 6 + 6 of
    1,024 with d_ff 8,192)."""
    sizes = dict(d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4)
    sizes |= dict(encoder_ffn_dim=2048, decoder_ffn_dim=2048, src_vocab_size=42024, tgt_vocab_size=42024)
    fsmt = fsmt_source(tmp_path / "wmt19-en-de", fsmt_tokenizer, **sizes)
    ours = AutoModelForSeq2SeqLM.from_pretrained(convert_model(tmp_path / "wmt19-en-de", tmp_path / "out")).eval()
    assert ours.config.source_vocab_size == 42024
    ids, mask = random_batch(42024, pad=1)
    ids[mask == 0] = 1
    ids[torch.arange(4), mask.sum(1) - 1] = 2
    decoder_ids = torch.cat([torch.full((4, 1), 2), ids[:, :-1]], dim=1)
    batch = {"input_ids": ids, "attention_mask": mask}
    assert_same_logits(fsmt, ours, batch, decoder_ids, mask, use_cache=False)
    for beams in (1, 4):
        expected = fsmt.generate(**batch, num_beams=beams, max_length=40, suppress_tokens=[1])
        assert torch.equal(ours.generate(**batch, num_beams=beams, max_length=40, suppress_tokens=[1]), expected)


@pytest.mark.slow
def test_a_transformer_wmt_en_de_sized_fairseq_checkpoint_converts_like_fsmt(tmp_path, codes):
    """fairseq's `transformer_wmt_en_de` at its size (d_model 512, 6 + 6 layers, 8 heads, d_ff 2048) with separate
    dictionaries, against its FSMT twin."""
    folder = tmp_path / "checkpoints"
    symbols = fairseq_dictionaries(folder, codes)
    sizes = (len(symbols["en"]), len(symbols["de"]))
    args = fairseq_arguments(embed_dim=512, encoder_ffn_embed_dim=2048, decoder_ffn_embed_dim=2048)
    args.encoder_layers = args.decoder_layers = 6
    args.encoder_attention_heads = args.decoder_attention_heads = 8
    state = fairseq_state_dict(args, sizes)
    save_fairseq_checkpoint(folder / "checkpoint_best.pt", args, state)
    ours = AutoModelForSeq2SeqLM.from_pretrained(convert_model(folder / "checkpoint_best.pt", tmp_path / "out"))
    twin = fsmt_twin(args, state, sizes)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    batch = dict(tokenizer([source for source, _ in PAIRS[:6]], return_tensors="pt", padding=True))
    decoder_ids = torch.randint(4, sizes[1], (6, 15), generator=torch.Generator().manual_seed(0))
    decoder_ids[:, 0] = 2
    decoder_mask = torch.ones_like(decoder_ids)
    decoder_mask[::2, 9:] = 0
    decoder_ids[decoder_mask == 0] = 1
    assert_same_logits(twin, ours.eval(), batch, decoder_ids, decoder_mask, use_cache=False)
    settings = dict(max_length=40, min_length=2, suppress_tokens=[1], forced_eos_token_id=2, early_stopping=True)
    for beams in (1, 4):
        expected = twin.generate(**batch, num_beams=beams, **settings)
        assert torch.equal(ours.generate(**batch, num_beams=beams, **settings), expected)
