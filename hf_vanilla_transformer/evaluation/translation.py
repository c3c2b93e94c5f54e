"""Translating many sentences: batched by length, beam search with the model's defaults (§6.1), BLEU."""

from __future__ import annotations

import argparse
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
from transformers.generation import CompileConfig

from ..data.batching import inference_batches
from ..data.translation_bounds import TRANSLATION_MAX_TOKENS, check_max_tokens, encode_within
from ..model.decoding_vanilla_transformer import FinishedHypotheses
from ..utils.kernels import without_cudnn_attention
from .metrics import compute_bleu


def load_translator(model: str | Path, device: str | torch.device = "cpu", trust_remote_code: bool = False):
    """(model in eval mode on `device`, tokenizer) from a trained folder or a Hub id.

    The model is this package's (importing it registers its classes), never the folder's own code: a folder or
    repository whose `config.json` points to code of its own is refused, its code not run, unless the caller opts
    in with `trust_remote_code` (the commands' `--trust_remote_code`). A folder that does not exist, or that holds no
    model or tokenizer, raises an OSError whose one-line message names it and what was expected; a missing local
    folder is reported without asking the Hub.
    """
    name = str(model)
    local = Path(name).expanduser()
    looks_local = local.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1
    if not local.exists() and looks_local:
        raise FileNotFoundError(
            f"{name} does not exist; expected a model folder (config.json, model.safetensors and "
            "the tokenizer files) or a Hub id."
        )
    if local.exists() and not local.is_dir():
        raise NotADirectoryError(f"{name} is a file; expected a model folder (or a Hub id).")
    try:
        loaded = AutoModelForSeq2SeqLM.from_pretrained(name, trust_remote_code=trust_remote_code).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        if "trust_remote_code" in str(error) and not trust_remote_code:
            raise OSError(
                f"{name} holds code of its own (config.json's auto_map) for a model this package does not know: not "
                "run. Pass --trust_remote_code (trust_remote_code=True) to run it, only if you trust its author."
            ) from None
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise OSError(f"Cannot load a model and its tokenizer from {name}: {first_line}") from error
    return loaded, tokenizer


def add_remote_code_argument(parser) -> None:
    """The commands' `--trust_remote_code`: the one way to run a model folder's own code (`load_translator`)."""
    parser.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="run the model folder's own code (config.json's auto_map) where it is not this package's model: only "
        "for a folder or repository whose author you trust (default: never)",
    )


def add_max_tokens_argument(parser) -> None:
    """The commands' `--max_tokens`: the padded source tokens of a batch, so the longest line any engine translates
    (data/translation_bounds.py); argparse names the flag and a value that is no positive number."""
    parser.add_argument(
        "--max_tokens",
        type=positive_tokens,
        default=TRANSLATION_MAX_TOKENS,
        help="padded source tokens per batch; a longer line is refused, naming it (default: %(default)s)",
    )


def positive_tokens(text: str) -> int:
    """--max_tokens: a positive whole number of tokens."""
    try:
        return check_max_tokens(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected a positive number of tokens") from None


# Sentences after which a compiled decoding step (static cache + torch.compile) has paid for its compilation, per
# device kind; a kind not listed stays eager under compile="auto".
# - CPU: never. On a 2-core AVX2 CPU the compiled step decodes 5-12% faster on batches of one shape
#   (`scripts/benchmark.py`), but on a real test split in batches by length it is slower even once compiled: 15.7
#   against 26.9 sentences/s with beam 4 (`scripts/deploy_benchmark.py`, docs/deploy.md; the compiled step attends
#   over the whole static cache, and every batch brings other shapes).
# - CUDA: an estimate, not yet measured on a real test split: on an H200 the compiled greedy step (CUDA graphs) of
#   the base model took 0.067 s against 0.146 s eager for 8 sentences of 32 tokens, 9.9 ms saved a sentence; a
#   compile of about 30 s (the CPU's took 3-34 s) and a graph per batch shape (bounded by `SHAPE_STEP`) pay for
#   themselves after about 4,000 sentences. `scripts/benchmark.py --device cuda` measures the break-even.
COMPILE_PAYS_AFTER_SENTENCES: dict[str, int] = {"cuda": 4000}
# Compiled, the batches' source lengths and decoding lengths are rounded up to a multiple of this: every new shape
# is another graph (and on CUDA another graph capture), and the rounding changes no token (padding is masked, and
# each sentence still stops at its own input length + 50).
SHAPE_STEP = 16
COMPILE_CHOICES = ("auto", "always", "never")
RECOMPILE_LIMIT = 64


def compile_pays(compile: str, device: torch.device | str, sentences: int) -> bool:
    """Whether `translate()` compiles its decoding step: "always", "never", or "auto" (where the input has more
    sentences than compiling needs to pay for itself on this kind of device)."""
    if compile not in COMPILE_CHOICES:
        raise ValueError(f"compile={compile!r} is invalid; expected one of {COMPILE_CHOICES}.")
    if compile != "auto":
        return compile == "always"
    threshold = COMPILE_PAYS_AFTER_SENTENCES.get(torch.device(device).type)
    return threshold is not None and sentences >= threshold


def decoding_compile_config(device: torch.device | str, fullgraph: bool = True) -> CompileConfig:
    """generate()'s own compile path (transformers' `CompileConfig`) on `device`: the decoding step compiled (with
    `fullgraph`: any graph break fails), CUDA graphs on CUDA (`reduce-overhead`), the first pass eager.
    transformers compiles on accelerators only unless told otherwise (its private `_compile_all_devices`, set here
    alone)."""
    on_cuda = torch.device(device).type == "cuda"
    config = CompileConfig(fullgraph=fullgraph, mode="reduce-overhead" if on_cuda else "default")
    config._compile_all_devices = not on_cuda
    return config


@contextmanager
def compiled_decoding(device: torch.device | str = "cpu"):
    """Within the block, the `generate()` keyword arguments that make transformers compile the decoding step (its
    compiled function is transformers' own, kept by the model for later calls; the model's `forward` is untouched).

    Every model's forward runs through the same transformers wrapper, so dynamo counts the graphs of all models
    compiled in a process against one code object; the block raises dynamo's recompile limit (8 by default, after
    which `fullgraph=True` fails) so that batch shapes and earlier compiled models cannot exhaust it.
    """
    limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    with torch._dynamo.config.patch(recompile_limit=limit):
        yield {"cache_implementation": "static", "compile_config": decoding_compile_config(device)}


@torch.no_grad()
def translate(
    model,
    tokenizer,
    sentences: list[str],
    max_tokens: int = TRANSLATION_MAX_TOKENS,
    max_sentences: int = 128,
    progress: bool = True,
    compile: str = "auto",
    **generate_kwargs,
) -> list[str]:
    """Translate `sentences`, longest first in batches of at most `max_tokens` padded source tokens.

    Sorting by length keeps padding (and the wasted decoding work on it) small; the output is in input order.
    Empty and whitespace-only sentences come back empty without reaching the model (which would only invent a
    sentence for them). `generate_kwargs` go to `model.generate` (e.g. `num_beams=1` for greedy decoding).
    `compile` ("auto", "always", "never") decides whether the decoding step runs compiled (`compile_pays`); the
    tokens are the same either way. The model runs in eval mode and is left in the mode it was given in. A sentence
    that alone holds more than `max_tokens` tokens is refused before any decoding (data/translation_bounds.py).
    """
    arguments = (max_tokens, max_sentences, progress, compile, generate_kwargs)
    return _translate_checked(model, tokenizer, sentences, *arguments, None)[None]


@torch.no_grad()
def translate_each_alpha(
    model,
    tokenizer,
    sentences: list[str],
    alphas: list[float],
    max_tokens: int = TRANSLATION_MAX_TOKENS,
    max_sentences: int = 128,
    progress: bool = True,
    compile: str = "auto",
    **generate_kwargs,
) -> dict[float, list[str]]:
    """`translate(..., length_penalty=alpha)` for each of `alphas`, from one beam search where the call's
    `early_stopping` is True (the model's default, §6.1): alpha then only ranks the hypotheses a sentence finished,
    and each alpha's translation is the best of them under it (`FinishedHypotheses`), the same tokens as a search of
    its own. Under another `early_stopping` rule, and for greedy search (where alpha changes nothing), each alpha is
    decoded on its own. {alpha: translations in input order}."""
    if not alphas:
        raise ValueError("translate_each_alpha needs at least one alpha.")
    if "length_penalty" in generate_kwargs:
        raise ValueError("translate_each_alpha takes its alphas in `alphas`, not `length_penalty`.")
    config = model.generation_config
    beams = generate_kwargs.get("num_beams", config.num_beams) or 1
    early_stopping = generate_kwargs.get("early_stopping", config.early_stopping)
    one_search = beams > 1 and early_stopping is True and generate_kwargs.get("num_return_sequences", 1) == 1
    arguments = (max_tokens, max_sentences, progress, compile)
    if not one_search or generate_kwargs.get("do_sample", config.do_sample):
        return {
            alpha: _translate_checked(
                model, tokenizer, sentences, *arguments, {**generate_kwargs, "length_penalty": alpha}, None
            )[None]
            for alpha in alphas
        }
    return _translate_checked(model, tokenizer, sentences, *arguments, generate_kwargs, list(alphas))


def _translate_checked(
    model, tokenizer, sentences, max_tokens, max_sentences, progress, compile, generate_kwargs, alphas
) -> dict[float | None, list[str]]:
    """`_translate` once the arguments are checked, in eval mode (the model left in the mode it was given in) and
    without cuDNN's attention (a new key length at every step)."""
    check_max_tokens(max_tokens)
    if isinstance(sentences, str):
        raise TypeError("translate() takes a list of sentences; wrap a single one in a list.")
    sentences = list(sentences)
    for sentence in sentences:
        if not isinstance(sentence, str):
            raise TypeError(f"translate() takes a list of strings; got a {type(sentence).__name__}: {sentence!r:.80}.")
    training = model.training
    model.eval()
    try:
        with without_cudnn_attention(next(model.parameters()).device):
            arguments = (max_tokens, max_sentences, progress, compile, generate_kwargs, alphas)
            return _translate(model, tokenizer, sentences, *arguments)
    finally:
        model.train(training)


def _translate(
    model, tokenizer, sentences, max_tokens, max_sentences, progress, compile, generate_kwargs, alphas
) -> dict[float | None, list[str]]:
    """The translations of `sentences`: {None: ...} as the call's arguments decode them, or with `alphas`, one beam
    search recorded (`FinishedHypotheses`) and {alpha: ...} the best of each sentence's finished hypotheses under
    each alpha."""
    texts = [i for i, sentence in enumerate(sentences) if sentence.strip()]  # the sentences to translate
    encoded = encode_within(lambda chunk: tokenizer(chunk)["input_ids"], sentences, texts, max_tokens)
    keys = alphas if alphas is not None else [None]
    outputs: dict[float | None, list[str]] = {key: [""] * len(sentences) for key in keys}
    configured = getattr(model.generation_config, "length_penalty_type", None)
    penalty_type = generate_kwargs.get("length_penalty_type", configured) or "hf"  # generate()'s default
    device = next(model.parameters()).device
    compiled = compile_pays(compile, device, len(texts))
    bar = tqdm(total=len(sentences), desc="translating", unit="sent", disable=not progress)
    bar.update(len(sentences) - len(texts))
    with compiled_decoding(device) if compiled else nullcontext({}) as extra:
        for batch in inference_batches([len(ids) for ids in encoded], max_tokens, max_sentences):
            step = SHAPE_STEP if compiled else 1
            features, lengths = batch_features(model, tokenizer, [encoded[i] for i in batch], step, generate_kwargs)
            recorded = {}
            if alphas is not None:
                recorded = {"finished_hypotheses": FinishedHypotheses(), "length_penalty": alphas[0]}
            generated = model.generate(**features.to(device), **extra, **lengths, **generate_kwargs, **recorded)
            for key in keys:
                if key is not None:
                    generated = recorded["finished_hypotheses"].best_for(key, penalty_type, len(batch))
                decoded = tokenizer.batch_decode(generated, skip_special_tokens=True)
                for index, text in zip(batch, decoded, strict=True):
                    outputs[key][texts[index]] = text.strip()
            bar.update(len(batch))
    bar.close()
    return outputs


def batch_features(model, tokenizer, ids: list[list[int]], step: int, generate_kwargs: dict) -> tuple[dict, dict]:
    """(the padded batch of `ids`, the decoding length to pass `generate()`) with the source and decoding lengths
    rounded up to a multiple of `step` (a compiled step meets fewer shapes; 1: as they are). The decoding length
    is set only where the call gives none and the model stops each sentence at its input length + N (§6.1), to
    the longest sentence's limit, rounded: a cap above every sentence's own, which changes no token."""
    features = tokenizer.pad({"input_ids": ids}, return_tensors="pt", pad_to_multiple_of=step if step > 1 else None)
    relative = generate_kwargs.get("relative_max_length", getattr(model.generation_config, "relative_max_length", None))
    capped = any(generate_kwargs.get(name) is not None for name in ("max_new_tokens", "max_length"))
    if step == 1 or relative is None or capped or model.generation_config.max_length is not None:
        return features, {}
    return features, {"max_new_tokens": -(-(max(map(len, ids)) + relative) // step) * step}


def evaluate_translations(
    model, tokenizer, sources: list[str], references: list[str], tokenized_bleu: bool = True, **translate_kwargs
) -> tuple[dict, list[str]]:
    """Translate `sources` and score them against `references`: (sacreBLEU/chrF result, hypotheses)."""
    hypotheses = translate(model, tokenizer, sources, **translate_kwargs)
    return compute_bleu(hypotheses, references, tokenized=tokenized_bleu), hypotheses
