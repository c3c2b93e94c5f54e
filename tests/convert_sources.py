"""Source models for the conversion tests, built here with their own classes and files, as their families write them:
a MarianMTModel folder with a MarianTokenizer (two SentencePiece models trained on the fixtures, a joint vocab.json),
an FSMT folder with an FSMTTokenizer (Moses + BPE learned on the fixtures), and a fairseq checkpoint (`args`
Namespace and a state dict under fairseq's names, its dictionaries and subword-nmt codes), with its FSMT twin:
fairseq's model in transformers holding the same weights."""

from __future__ import annotations

import argparse
import collections
import io
import json
from pathlib import Path

import torch
from transformers import (
    FSMTConfig,
    FSMTForConditionalGeneration,
    FSMTTokenizer,
    GenerationConfig,
    MarianConfig,
    MarianMTModel,
    MarianTokenizer,
)

from conftest import FIXTURES


def fixture_pairs(name: str = "libreoffice_help_en_de_200.tsv") -> list[tuple[str, str]]:
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    return [tuple(line.split("\t")) for line in lines]


PAIRS = fixture_pairs()
SENTENCES = PAIRS + fixture_pairs("libreoffice_help_en_de_test_40.tsv")  # 240 real pairs


def draw_weights(model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that outputs depend on the source (transformers' N(0, 0.02) makes a random model say
    the same for every input): projections N(0, 1/fan_in), embeddings N(0, 1/d), biases and LayerNorms near 0 and 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name:  # the sinusoids, which the source computes
                continue
            noise = torch.randn(parameter.shape, generator=generator)
            if "layer_norm" in name or "layernorm" in name:
                parameter.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_(noise * parameter.shape[-1] ** -0.5)


def favour_the_end(output_row: torch.Tensor, final_norm_bias: torch.Tensor, shift: float) -> None:
    """Raise the logit of the token whose output row this is by about `shift` at every position (so that a random
    model's sentences end at various lengths; the seeds and shifts are chosen for that): the decoder's
    output is LayerNorm'ed, then shifted by the last LayerNorm's bias b, so adding shift * b / |b|^2 to the row adds
    `shift` to that logit (plus noise)."""
    with torch.no_grad():
        output_row += shift * final_norm_bias / final_norm_bias.norm() ** 2


# --- Marian ----------------------------------------------------------------------------------------------------------


def marian_tokenizer_files(folder: Path, pieces: int = 250) -> MarianTokenizer:
    """source.spm and target.spm (unigram SentencePiece models of the English and German fixtures) and vocab.json
    (Marian's joint vocabulary: </s>=0, <unk>=1, the pieces of both, <pad> last)."""
    import sentencepiece

    folder.mkdir(parents=True, exist_ok=True)
    vocabulary = {"</s>": 0, "<unk>": 1}
    for side, name in ((0, "source.spm"), (1, "target.spm")):
        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter([pair[side] for pair in PAIRS]),
            model_writer=model,
            vocab_size=pieces,
            model_type="unigram",
            character_coverage=1.0,
            bos_id=-1,
            eos_id=-1,
            unk_id=0,
            minloglevel=2,
        )
        (folder / name).write_bytes(model.getvalue())
        processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
        for index in range(processor.get_piece_size()):
            vocabulary.setdefault(processor.id_to_piece(index), len(vocabulary))
    vocabulary["<pad>"] = len(vocabulary)
    (folder / "vocab.json").write_text(json.dumps(vocabulary), encoding="utf-8")
    return MarianTokenizer(
        str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"), "en", "de"
    )


def marian_source(
    folder: Path, tokenizer: MarianTokenizer, seed: int = 8, eos_shift: float = 3.0, **config
) -> MarianMTModel:
    """A MarianMTModel as opus-mt-en-de is configured (swish, scaled embeddings, </s>=0, <pad> last and the
    decoder's start, a non-zero final_logits_bias, beam 4), small unless `config` says otherwise, saved with the
    tokenizer into `folder`. `</s>` is made likely enough that sentences end at different lengths."""
    vocab = config.pop("vocab_size", len(tokenizer))  # a larger vocabulary than the tokenizer's: the published size
    sizes = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4)
    sizes |= dict(encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=256)
    marian_config = MarianConfig(
        **{
            **sizes,
            "vocab_size": vocab,
            "decoder_vocab_size": vocab,
            "activation_function": "swish",
            "scale_embedding": True,
            "pad_token_id": vocab - 1,
            "decoder_start_token_id": vocab - 1,
            "eos_token_id": 0,
            "forced_eos_token_id": 0,
            "dropout": 0.1,
            **config,
        }
    )
    model = MarianMTModel(marian_config).eval()
    draw_weights(model, seed)
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(seed))
    favour_the_end(
        model.get_output_embeddings().weight[0], model.model.decoder.layers[-1].final_layer_norm.bias, eos_shift
    )
    pad = vocab - 1
    model.generation_config = GenerationConfig(
        num_beams=4, max_length=48, bad_words_ids=[[pad]], decoder_start_token_id=pad, eos_token_id=0,
        pad_token_id=pad, forced_eos_token_id=0,
    )  # fmt: skip
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


# --- BPE as fairseq's data preparation makes it: Moses, subword-nmt ----------------------------------------------------


def moses(text: str, lang: str, dash_splits: bool = True, escape: bool = True) -> str:
    """fairseq's `--tokenizer moses`: sacremoses with aggressive dash splits and escaping (unless
    `--moses-no-dash-splits`, `--moses-no-escape` turn them off)."""
    import sacremoses

    return sacremoses.MosesTokenizer(lang=lang).tokenize(
        text, aggressive_dash_splits=dash_splits, return_str=True, escape=escape
    )


def bpe_codes(symbols: int = 300) -> str:
    """subword-nmt codes (`#version: 0.2`) learned jointly on the Moses-tokenized fixtures."""
    from subword_nmt import learn_bpe

    text = "\n".join(moses(pair[side], lang) for pair in PAIRS for side, lang in ((0, "en"), (1, "de"))) + "\n"
    codes = io.StringIO()
    learn_bpe.learn_bpe(io.StringIO(text), codes, symbols)
    return codes.getvalue()


def fairseq_dictionaries(folder: Path, codes: str, joined: bool = False) -> dict[str, list[str]]:
    """dict.en.txt and dict.de.txt as fairseq-preprocess writes them (BPE pieces by falling count; `joined`: one
    dictionary of both languages in both files, as `--joined-dictionary` makes it) and bpecodes; returns each
    language's symbols in id order (fairseq's four specials first)."""
    from subword_nmt import apply_bpe

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bpecodes").write_text(codes, encoding="utf-8")
    bpe = apply_bpe.BPE(io.StringIO(codes))
    counts = {}
    for side, lang in ((0, "en"), (1, "de")):
        counts[lang] = collections.Counter(
            piece for pair in PAIRS for piece in bpe.process_line(moses(pair[side], lang)).split()
        )
    if joined:
        counts = dict.fromkeys(counts, counts["en"] + counts["de"])
    symbols = {}
    for lang, counted in counts.items():
        lines = [f"{piece} {count}\n" for piece, count in counted.most_common()]
        (folder / f"dict.{lang}.txt").write_text("".join(lines), encoding="utf-8")
        symbols[lang] = ["<s>", "<pad>", "</s>", "<unk>", *(line.rsplit(" ", 1)[0] for line in lines)]
    return symbols


def fairseq_reference_ids(text: str, lang: str, codes: str, symbols: list[str], **moses_flags) -> list[int]:
    """fairseq's ids of `text`: Moses (`moses_flags`), subword-nmt's BPE, the dictionary (`<unk>` for a piece not
    in it), `</s>`."""
    from subword_nmt import apply_bpe

    index = {symbol: position for position, symbol in enumerate(symbols)}
    pieces = apply_bpe.BPE(io.StringIO(codes)).process_line(moses(text, lang, **moses_flags)).split()
    return [index.get(piece, 3) for piece in pieces] + [2]


# --- FSMT ------------------------------------------------------------------------------------------------------------


def fsmt_tokenizer_files(folder: Path, codes: str) -> FSMTTokenizer:
    """vocab-src.json, vocab-tgt.json and merges.txt as transformers' FSMT folders hold them: the merges of the
    codes, and each side's vocabulary as FSMTTokenizer itself segments the fixtures (`</w>` ends a word)."""
    folder.mkdir(parents=True, exist_ok=True)
    merges = [line for line in codes.splitlines()[1:] if line.strip()]  # the codes without their version line
    (folder / "merges.txt").write_text("".join(f"{merge}\n" for merge in merges), encoding="utf-8")
    specials = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for name in ("vocab-src.json", "vocab-tgt.json"):
        (folder / name).write_text(json.dumps(specials), encoding="utf-8")
    files = {
        "src_vocab_file": str(folder / "vocab-src.json"),
        "tgt_vocab_file": str(folder / "vocab-tgt.json"),
        "merges_file": str(folder / "merges.txt"),
    }
    for side, (name, lang) in enumerate((("vocab-src.json", "en"), ("vocab-tgt.json", "de"))):
        segmenter = FSMTTokenizer(langs=[lang, lang], **files)
        vocabulary = dict(specials)
        for pair in PAIRS:
            for piece in segmenter.tokenize(pair[side]):
                vocabulary.setdefault(piece, len(vocabulary))
        (folder / name).write_text(json.dumps(vocabulary, ensure_ascii=False), encoding="utf-8")
    return FSMTTokenizer(langs=["en", "de"], **files)


def fsmt_source(
    folder: Path, tokenizer: FSMTTokenizer, seed: int = 0, eos_shift: float = 1.0, **config
) -> FSMTForConditionalGeneration:
    """An FSMT model as facebook/wmt19-en-de is configured (fairseq's positions, decoding from </s>, beam 5, length
    penalty 1.1), small unless `config` says otherwise, with an encoder embedding and an output projection of their
    own (`tie_word_embeddings=False`), saved with the tokenizer into `folder`."""
    sizes = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4)
    sizes |= dict(encoder_ffn_dim=64, decoder_ffn_dim=64)
    fsmt_config = FSMTConfig(
        **{
            **sizes,
            "langs": ["en", "de"],
            "src_vocab_size": tokenizer.src_vocab_size,
            "tgt_vocab_size": tokenizer.tgt_vocab_size,
            "dropout": 0.2,
            "attention_dropout": 0.1,
            "tie_word_embeddings": False,
            **config,
        }
    )
    model = FSMTForConditionalGeneration(fsmt_config).eval()
    draw_weights(model, seed)
    last_norm = model.model.decoder.layers[-1].final_layer_norm
    favour_the_end(model.model.decoder.output_projection.weight[2], last_norm.bias, eos_shift)
    model.generation_config = GenerationConfig(
        num_beams=5, length_penalty=1.1, max_length=48, early_stopping=True, decoder_start_token_id=2,
        eos_token_id=2, pad_token_id=1, bos_token_id=0, forced_eos_token_id=2,
    )  # fmt: skip
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


# --- fairseq ---------------------------------------------------------------------------------------------------------


def fairseq_arguments(**overrides) -> argparse.Namespace:
    """The `args` of a `transformer_wmt_en_de` checkpoint as fairseq writes them (the architecture's values filled
    in, and training's own arguments beside them), small unless `overrides` say otherwise."""
    sizes = dict(embed_dim=32, ffn_embed_dim=64, layers=2, attention_heads=4)
    values = {f"{stack}_{key}": value for stack in ("encoder", "decoder") for key, value in sizes.items()}
    values |= dict(
        arch="transformer_wmt_en_de", task="translation", data="data-bin/wmt16_en_de", source_lang="en",
        target_lang="de", encoder_normalize_before=False, decoder_normalize_before=False, encoder_learned_pos=False,
        decoder_learned_pos=False, decoder_output_dim=32, decoder_input_dim=32, attention_dropout=0.0,
        activation_dropout=0.0, relu_dropout=0.0, activation_fn="relu", dropout=0.1, adaptive_softmax_cutoff=None,
        adaptive_softmax_dropout=0, share_decoder_input_output_embed=True, share_all_embeddings=False,
        no_token_positional_embeddings=False, adaptive_input=False, no_cross_attention=False,
        cross_self_attention=False, layer_wise_attention=False, no_scale_embedding=False, layernorm_embedding=False,
        tie_adaptive_weights=False, max_source_positions=1024, max_target_positions=1024, left_pad_source="True",
        left_pad_target="False", optimizer="adam", adam_betas="(0.9, 0.98)", lr=[0.0007], lr_scheduler="inverse_sqrt",
        warmup_updates=4000, criterion="label_smoothed_cross_entropy", label_smoothing=0.1, max_tokens=3584, seed=1,
    )  # fmt: skip
    if "embed_dim" in overrides:
        width = overrides.pop("embed_dim")
        values |= dict(
            encoder_embed_dim=width, decoder_embed_dim=width, decoder_output_dim=width, decoder_input_dim=width
        )
    return argparse.Namespace(**{**values, **overrides})


def fairseq_state_dict(
    args: argparse.Namespace, sizes: tuple[int, int], seed: int = 0, eos_shift: float = 1.75
) -> dict[str, torch.Tensor]:
    """A `TransformerModel` state dict under fairseq's names (fairseq 0.9 and later), random weights; `sizes` are
    the source and target dictionaries'. The output projection is the target embedding
    (`share_decoder_input_output_embed`), present under both names as fairseq saves it."""
    generator = torch.Generator().manual_seed(seed)
    width, ffn = args.encoder_embed_dim, args.encoder_ffn_embed_dim

    def draw(*shape: int, std: float = 0.3) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * std

    state = {}
    for stack, size in zip(("encoder", "decoder"), sizes, strict=True):
        state[f"{stack}.version"] = torch.tensor([3.0])
        state[f"{stack}.embed_tokens.weight"] = draw(size, width, std=width**-0.5)
        state[f"{stack}.embed_positions._float_tensor"] = torch.tensor([])
        parts = ("self_attn", "encoder_attn") if stack == "decoder" else ("self_attn",)
        for index in range(getattr(args, f"{stack}_layers")):
            prefix = f"{stack}.layers.{index}"
            for part in parts:
                for projection in ("k_proj", "v_proj", "q_proj", "out_proj"):
                    state[f"{prefix}.{part}.{projection}.weight"] = draw(width, width, std=width**-0.5)
                    state[f"{prefix}.{part}.{projection}.bias"] = draw(width, std=0.1)
            for norm in (*(f"{part}_layer_norm" for part in parts), "final_layer_norm"):
                state[f"{prefix}.{norm}.weight"] = 1.0 + draw(width, std=0.1)
                state[f"{prefix}.{norm}.bias"] = draw(width, std=0.1)
            state[f"{prefix}.fc1.weight"], state[f"{prefix}.fc1.bias"] = draw(ffn, width, std=width**-0.5), draw(ffn)
            state[f"{prefix}.fc2.weight"], state[f"{prefix}.fc2.bias"] = draw(width, ffn, std=ffn**-0.5), draw(width)
    last = args.decoder_layers - 1
    favour_the_end(
        state["decoder.embed_tokens.weight"][2], state[f"decoder.layers.{last}.final_layer_norm.bias"], eos_shift
    )
    state["decoder.output_projection.weight"] = state["decoder.embed_tokens.weight"]
    return state


def save_fairseq_checkpoint(
    path: Path, args: argparse.Namespace, state: dict[str, torch.Tensor], sections: dict | None = None, **extra
) -> Path:
    """`path` as fairseq's `save_checkpoint` writes it: args, model, optimizer history, extra state (with `extra`).
    With `sections` as fairseq 0.10 and later write it instead: no `args`, a `cfg` of the model's arguments, the task
    and `sections` (`{"tokenizer": {"_name": "moses", ...}, "bpe": {...}}`)."""
    task = {"_name": "translation", "source_lang": args.source_lang, "target_lang": args.target_lang}
    torch.save(
        {
            "args": None if sections is not None else args,
            **({"cfg": {"model": args, "task": task, **sections}} if sections is not None else {}),
            "model": state,
            "optimizer_history": [
                {
                    "criterion_name": "LabelSmoothedCrossEntropyCriterion",
                    "optimizer_name": "FairseqAdam",
                    "lr_scheduler_state": {"best": 3.91},
                    "num_updates": 100,
                }
            ],
            "extra_state": {
                "epoch": 2,
                "val_loss": 3.91,
                "train_iterator": {"epoch": 2, "iterations_in_epoch": 0},
                **extra,
            },
        },
        path,
    )
    return path


def fsmt_twin(args: argparse.Namespace, state: dict[str, torch.Tensor], sizes: tuple[int, int]):
    """FSMT (fairseq's Transformer in transformers) holding a fairseq state dict: the names prefixed with `model.`,
    as transformers' conversion script loads fairseq's weights; its own position tables left as FSMT makes them."""
    config = FSMTConfig(
        langs=[args.source_lang, args.target_lang],
        src_vocab_size=sizes[0],
        tgt_vocab_size=sizes[1],
        d_model=args.encoder_embed_dim,
        encoder_layers=args.encoder_layers,
        decoder_layers=args.decoder_layers,
        encoder_attention_heads=args.encoder_attention_heads,
        decoder_attention_heads=args.decoder_attention_heads,
        encoder_ffn_dim=args.encoder_ffn_embed_dim,
        decoder_ffn_dim=args.decoder_ffn_embed_dim,
        dropout=args.dropout,
        scale_embedding=not args.no_scale_embedding,
        tie_word_embeddings=False,
    )
    model = FSMTForConditionalGeneration(config).eval()
    weights = {f"model.{name}": tensor for name, tensor in state.items() if not name.endswith(("version", "_tensor"))}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and all("embed_positions" in name for name in missing), (missing, unexpected)
    return model


# --- fairseq itself (the optional `fairseq-fixed`, docs/converting.md) ---------------------------------------------


def fairseq_built_model(folder: Path, codes: str, seed: int = 0, eos_shift: float = 0.9):
    """A small `transformer_wmt_en_de` (d_model 32, 2 + 2 layers, separate dictionaries, the output projection
    shared with the target embedding) built by fairseq itself: its command-line parser and architecture defaults,
    its translation task over `fairseq_dictionaries`, its model builder, trained with `--tokenizer moses --bpe
    subword_nmt`; weights drawn as `draw_weights` draws them, then saved by its Trainer's own checkpoint code into
    `folder/checkpoint_last.pt`. Returns (task, model, cfg)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    fairseq_dictionaries(folder, codes)
    sizes = ("--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64")
    sizes += ("--decoder-ffn-embed-dim", "64", "--encoder-layers", "2", "--decoder-layers", "2")
    sizes += ("--encoder-attention-heads", "4", "--decoder-attention-heads", "4")
    arguments = [str(folder), "--arch", "transformer_wmt_en_de", "--task", "translation", *sizes]
    arguments += ["--source-lang", "en", "--target-lang", "de", "--share-decoder-input-output-embed", "--cpu"]
    arguments += ["--optimizer", "adam", "--lr", "0.0007", "--criterion", "label_smoothed_cross_entropy"]
    arguments += ["--max-tokens", "1000", "--tokenizer", "moses", "--bpe", "subword_nmt"]
    arguments += ["--bpe-codes", str(folder / "bpecodes"), "--save-dir", str(folder), "--seed", str(seed)]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), arguments))
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model).eval()
    draw_weights(model, seed)
    last_norm = model.decoder.layers[-1].final_layer_norm
    favour_the_end(model.decoder.embed_tokens.weight.data[2], last_norm.bias.data, eos_shift)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()  # as fairseq's checkpoint_utils.save_checkpoint does first
    trainer.save_checkpoint(str(folder / "checkpoint_last.pt"), {})
    return task, model.eval(), cfg
