"""Decoding as §6.1: beam 4, GNMT length penalty, at most input length + 50 tokens, early stopping."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration, gnmt_length_penalty

from conftest import BOS, EOS, PAD, random_ids, run_without_package, tiny_model


def sequence_log_prob(model, source: torch.Tensor, sequence: torch.Tensor) -> tuple[float, int]:
    """Sum of log P(y_t | y_<t, x) over the generated tokens of `sequence` (start token first, padding after)."""
    tokens = sequence[1:]
    if (tokens == EOS).any():
        tokens = tokens[: int((tokens == EOS).nonzero()[0]) + 1]
    with torch.no_grad():
        logits = model(input_ids=source[None], decoder_input_ids=sequence[None, : len(tokens)]).logits[0]
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, tokens[:, None]).sum().item(), len(tokens)


def test_default_generation_config_is_the_paper():
    config = tiny_model().generation_config
    assert config.num_beams == 4
    assert config.length_penalty == 0.6 and config.length_penalty_type == "gnmt"
    assert config.relative_max_length == 50
    assert config.early_stopping is True
    assert config.decoder_start_token_id == BOS and config.eos_token_id == EOS and config.pad_token_id == PAD


@pytest.mark.parametrize("num_return_sequences", [1, 3])
def test_sequences_scores_are_gnmt_normalised_log_probs(num_return_sequences):
    model = tiny_model(seed=3)
    sources = random_ids(4, 6, seed=11)
    sources[2, 4:] = PAD
    mask = (sources != PAD).long()
    out = model.generate(
        sources,
        attention_mask=mask,
        max_new_tokens=7,
        num_return_sequences=num_return_sequences,
        output_scores=True,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape[0] == 4 * num_return_sequences
    matched_hf = 0
    for row, sequence in enumerate(out.sequences):
        index = row // num_return_sequences
        source = sources[index, : int(mask[index].sum())]
        log_prob, length = sequence_log_prob(model, source, sequence)
        expected = log_prob / gnmt_length_penalty(length, 0.6)
        assert out.sequences_scores[row].item() == pytest.approx(expected, abs=1e-4)
        matched_hf += abs(out.sequences_scores[row].item() - log_prob / length**0.6) < 1e-4
    assert matched_hf == 0  # the scores are not HF's |Y|^alpha ones


def test_hf_length_penalty_is_still_available():
    model = tiny_model(seed=3)
    sources = random_ids(2, 6, seed=11)
    out = model.generate(
        sources, max_new_tokens=7, length_penalty_type="hf", output_scores=True, return_dict_in_generate=True
    )
    for row, sequence in enumerate(out.sequences):
        log_prob, length = sequence_log_prob(model, sources[row], sequence)
        assert out.sequences_scores[row].item() == pytest.approx(log_prob / length**0.6, abs=1e-4)
    with pytest.raises(ValueError, match="length_penalty_type='linear'"):
        model.generate(sources, length_penalty_type="linear")


@pytest.mark.parametrize("trailing", [(), (9,), (2, 3)])
def test_the_gather_of_beams_is_transformers_own(trailing):
    """`_gather_beams` is one `gather` where transformers' `take_along_dim` also wraps negative indices: the same
    beams for every shape and dtype beam search gathers (scores, flags, beam indices, hypotheses); the whole search
    is the next test's."""
    from transformers.generation import GenerationMixin

    generator = torch.Generator().manual_seed(0)
    beams = torch.randint(0, 8, (3, 5), generator=generator)
    scores = torch.randn(3, 8, *trailing, generator=generator)
    for tensor in (scores, scores > 0, (scores * 100).int(), (scores * 100).long()):  # scores, flags, indices, ids
        ours = VanillaTransformerForConditionalGeneration._gather_beams(tensor, beams)
        assert ours.dtype == tensor.dtype and torch.equal(ours, GenerationMixin._gather_beams(tensor, beams))
    # An index of another shape (one row for every sentence) is transformers' own, broadcast.
    one_row = beams[:1]
    assert torch.equal(
        VanillaTransformerForConditionalGeneration._gather_beams(scores, one_row),
        GenerationMixin._gather_beams(scores, one_row),
    )


def test_beam_search_with_transformers_gather_gives_the_same_search(monkeypatch):
    from transformers.generation import GenerationMixin

    model = tiny_model(seed=3)
    sources = random_ids(4, 6, seed=11)
    sources[2, 4:] = PAD
    kwargs = dict(
        attention_mask=(sources != PAD).long(),
        max_new_tokens=9,
        num_return_sequences=2,
        output_scores=True,
        return_dict_in_generate=True,
    )
    ours = model.generate(sources, **kwargs)
    monkeypatch.setattr(model, "_gather_beams", GenerationMixin._gather_beams)
    reference = model.generate(sources, **kwargs)
    assert torch.equal(ours.sequences, reference.sequences)
    assert torch.equal(ours.sequences_scores, reference.sequences_scores)
    assert torch.equal(ours.beam_indices, reference.beam_indices)


def test_an_exhaustive_beam_finds_the_brute_force_best_under_gnmt():
    # Tokens 3, 4, 5 only (pad and bos suppressed), at most 3 new tokens: 1 + 3 + 9 sequences end with EOS and 27
    # stop at the length limit. A beam of 27 keeps every prefix alive, so beam search must find the best of all 40.
    model = tiny_model(seed=5, vocab_size=6)
    for seed in range(3):
        source = random_ids(1, 4, vocab=6, seed=seed)
        out = model.generate(
            source,
            num_beams=27,
            max_new_tokens=3,
            suppress_tokens=[PAD, BOS],
            relative_max_length=None,
            output_scores=True,
            return_dict_in_generate=True,
        )
        candidates = []
        for length in range(4):
            for body in itertools.product([3, 4, 5], repeat=length):
                ending = [EOS] if length < 3 else []
                candidates.append(torch.tensor([BOS, *body, *ending]))
        scored = []
        for candidate in candidates:
            log_prob, length = sequence_log_prob(model, source[0], candidate)
            scored.append((log_prob / gnmt_length_penalty(length, 0.6), candidate))
        best_score, best = max(scored, key=lambda item: item[0])
        found = out.sequences[0][: len(best)]
        assert torch.equal(found, best), (found, best)
        assert out.sequences_scores[0].item() == pytest.approx(best_score, abs=1e-4)


class SuppressEos(LogitsProcessor):
    def __call__(self, input_ids, scores):
        scores[:, EOS] = -float("inf")
        return scores


class EosAfter(LogitsProcessor):
    """Makes EOS overwhelmingly likely once `n` tokens have been generated."""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] - 1 >= self.n:
            scores[:, EOS] += 100.0
        return scores


def new_token_counts(sequences: torch.Tensor) -> list[int]:
    """Generated tokens per row, the end-of-sentence token included, padding not."""
    return [int((row[1:] != PAD).sum()) for row in sequences]


@pytest.mark.parametrize("num_beams", [1, 4])
def test_each_sentence_stops_at_its_source_length_plus_50(num_beams):
    model = tiny_model(seed=1)
    sources = torch.full((2, 20), PAD)
    sources[0, :5] = random_ids(1, 5, seed=1)[0]
    sources[1] = random_ids(1, 20, seed=2)[0]
    mask = (sources != PAD).long()
    out = model.generate(
        sources,
        attention_mask=mask,
        num_beams=num_beams,
        logits_processor=LogitsProcessorList([SuppressEos()]),
        suppress_tokens=[PAD],
    )
    assert new_token_counts(out) == [55, 70]
    assert out.shape[1] == 1 + 70


def test_source_length_comes_from_padding_without_a_mask():
    model = tiny_model(seed=1)
    sources = torch.full((2, 8), PAD)
    sources[0, :3] = torch.tensor([5, 6, 7])
    sources[1] = random_ids(1, 8, seed=4)[0]
    out = model.generate(
        sources, num_beams=1, relative_max_length=4, suppress_tokens=[PAD, EOS], attention_mask=(sources != PAD).long()
    )
    assert new_token_counts(out) == [7, 12]
    out = model.generate(sources, num_beams=1, relative_max_length=4, suppress_tokens=[PAD, EOS])
    assert new_token_counts(out) == [7, 12]


def test_max_new_tokens_still_caps_every_sentence():
    model = tiny_model(seed=1)
    sources = random_ids(2, 5)
    out = model.generate(
        sources, max_new_tokens=9, logits_processor=LogitsProcessorList([SuppressEos()]), suppress_tokens=[PAD]
    )
    assert new_token_counts(out) == [9, 9]
    out = model.generate(sources, relative_max_length=None, max_new_tokens=60, suppress_tokens=[PAD, EOS])
    assert new_token_counts(out) == [60, 60]


@pytest.mark.parametrize("num_beams", [1, 4])
def test_early_stopping_when_eos_comes(num_beams):
    model = tiny_model(seed=1)
    sources = random_ids(2, 10)
    out = model.generate(sources, num_beams=num_beams, logits_processor=LogitsProcessorList([EosAfter(3)]))
    assert out.shape[1] <= 1 + 4  # stopped at EOS, far below 10 + 50
    assert (out[:, 1:] == EOS).any(dim=1).all()


def test_greedy_sampling_and_other_beams_per_call():
    model = tiny_model(seed=1)
    sources = random_ids(3, 6)
    greedy = model.generate(sources, num_beams=1, do_sample=False, max_new_tokens=6)
    step = sources.new_full((3, 1), BOS)
    with torch.no_grad():
        for _ in range(6):
            logits = model(input_ids=sources, decoder_input_ids=step).logits[:, -1]
            step = torch.cat([step, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(greedy, step)
    torch.manual_seed(0)
    sampled = model.generate(sources, do_sample=True, num_beams=1, max_new_tokens=6, top_k=1)
    assert torch.equal(sampled, greedy)  # sampling from the single most likely token is greedy search
    wide = model.generate(
        sources, num_beams=8, num_return_sequences=8, max_new_tokens=6, output_scores=True, return_dict_in_generate=True
    )
    assert wide.sequences.shape[0] == 24
    scores = wide.sequences_scores.view(3, 8)
    assert torch.all(scores[:, :-1] >= scores[:, 1:])  # each sentence's 8 hypotheses, best first
    assert len({tuple(row.tolist()) for row in wide.sequences[:8]}) == 8  # 8 different hypotheses


def test_relative_max_length_is_checked():
    model = tiny_model()
    with pytest.raises(ValueError, match="relative_max_length=-1"):
        model.generate(random_ids(1, 4), relative_max_length=-1)


@pytest.mark.parametrize("num_beams", [0, -2, 1.5])
def test_num_beams_out_of_range_is_named(num_beams):
    with pytest.raises(ValueError, match=f"num_beams={num_beams} is invalid; expected an integer >= 1"):
        tiny_model().generate(random_ids(1, 4), num_beams=num_beams)


def test_without_a_source_decoding_starts_from_bos_as_in_transformers():
    # transformers' encoder-decoders read a source of BOS alone when generate() gets no input; "input length + 50"
    # needs a source, so it steps aside and max_new_tokens (or transformers' default length) decides.
    model = tiny_model(seed=1)
    greedy = model.generate(max_new_tokens=5, num_beams=1, suppress_tokens=[EOS])
    assert greedy.shape == (1, 6) and greedy[0, 0] == BOS
    bos_source = torch.tensor([[BOS]])
    assert torch.equal(greedy, model.generate(bos_source, max_new_tokens=5, num_beams=1, suppress_tokens=[EOS]))
    beams = model.generate(max_new_tokens=5)  # the paper's beam search
    assert torch.equal(beams, model.generate(bos_source, max_new_tokens=5))


def test_the_relative_rule_measures_inputs_embeds_too():
    model = tiny_model(seed=1)
    sources = random_ids(2, 4)
    embeds = model.get_input_embeddings()(sources)
    out = model.generate(inputs_embeds=embeds, num_beams=1, relative_max_length=3, suppress_tokens=[PAD, EOS])
    assert new_token_counts(out) == [7, 7]
    assert torch.equal(out, model.generate(sources, num_beams=1, relative_max_length=3, suppress_tokens=[PAD, EOS]))


class GenerateInside(LogitsProcessor):
    """Runs a whole generate() of the same model, with other rules, at every step of the outer one."""

    def __init__(self, model, source: torch.Tensor):
        self.model, self.source, self.calls = model, source, 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        self.model.generate(self.source, num_beams=2, length_penalty_type="hf", max_new_tokens=2)
        return scores


def test_generate_inside_generate_keeps_each_calls_rules_and_nothing_on_the_model():
    model = tiny_model(seed=3)
    sources = random_ids(2, 6, seed=11)
    attributes = set(vars(model))
    plain = model.generate(sources, max_new_tokens=7, output_scores=True, return_dict_in_generate=True)
    inside = GenerateInside(model, sources[:1])
    nested = model.generate(
        sources,
        max_new_tokens=7,
        logits_processor=LogitsProcessorList([inside]),
        output_scores=True,
        return_dict_in_generate=True,
    )
    assert inside.calls >= 2
    assert torch.equal(nested.sequences, plain.sequences)
    assert torch.allclose(nested.sequences_scores, plain.sequences_scores)
    log_prob, length = sequence_log_prob(model, sources[0], nested.sequences[0])  # still GNMT's, not the inner HF's
    assert nested.sequences_scores[0].item() == pytest.approx(log_prob / gnmt_length_penalty(length, 0.6), abs=1e-4)
    assert set(vars(model)) == attributes  # no per-call state left on the model


def test_assisted_decoding_with_the_model_as_its_own_assistant():
    model = tiny_model(seed=3)
    source = random_ids(1, 6, seed=11)
    assisted = model.generate(source, num_beams=1, max_new_tokens=6, assistant_model=model)
    assert torch.equal(assisted, model.generate(source, num_beams=1, max_new_tokens=6))


def test_save_load_and_remote_code_keep_the_defaults(tmp_path):
    model = tiny_model(seed=2)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(folder)
    assert loaded.generation_config.to_diff_dict() == model.generation_config.to_diff_dict()
    sources = random_ids(2, 5)
    expected = model.generate(sources, output_scores=True, return_dict_in_generate=True)
    torch.save(sources, tmp_path / "sources.pt")
    result = run_without_package(
        f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True)
        config = model.generation_config
        out = model.generate(torch.load("sources.pt"), output_scores=True, return_dict_in_generate=True)
        torch.save({{"defaults": (config.num_beams, config.length_penalty, config.length_penalty_type,
                                  config.relative_max_length, config.early_stopping),
                    "sequences": out.sequences, "scores": out.sequences_scores}}, "remote.pt")
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    remote = torch.load(tmp_path / "remote.pt")
    assert remote["defaults"] == (4, 0.6, "gnmt", 50, True)
    assert torch.equal(remote["sequences"], expected.sequences)
    assert torch.allclose(remote["scores"], expected.sequences_scores)


class SentenceBigrams(LogitsProcessor):
    """A fixed random bigram table per sentence on top of a tiny model's logits, and an end that comes early for
    some prefixes and not for others: sentences that differ and end at different lengths, where the length penalty
    decides which of a sentence's finished hypotheses wins (a random tiny model alone decodes every source alike)."""

    def __init__(self, beams: int = 4, bonus: float = 3.0):
        self.beams, self.bonus = beams, bonus
        self.table = torch.randn(200, 200, generator=torch.Generator().manual_seed(0)) * 2.0

    def __call__(self, input_ids, scores):
        sentence = torch.arange(input_ids.shape[0]) // self.beams
        scores = scores + self.table[(input_ids[:, -1] + 7 * sentence) % 200, : scores.shape[1]]
        ends = ((input_ids.sum(-1) + sentence) % 3 == 0) & (input_ids.shape[1] > 2)
        scores[:, EOS] += torch.where(ends, self.bonus, -3.0)
        scores[:, PAD] = -float("inf")
        return scores


def up_to_the_end(row: torch.Tensor) -> list[int]:
    """A generated row without the padding after its </s> (a row with none is as long as the longest)."""
    tokens = row.tolist()
    return tokens[: tokens.index(EOS, 1) + 1] if EOS in tokens[1:] else tokens


ALPHAS = [0.0, 0.6, 1.0, 1.5, 3.0]


@pytest.mark.parametrize("penalty_type", ["gnmt", "hf"])
def test_one_beam_search_finishes_what_every_alpha_would_choose(penalty_type):
    """With early stopping (§6.1) alpha ranks a sentence's finished hypotheses and changes nothing else: the best
    under each alpha of what one search finished is what a search with that alpha returns, token for token."""
    from hf_vanilla_transformer.model.decoding_vanilla_transformer import FinishedHypotheses

    model = tiny_model(seed=3)
    sources = random_ids(12, 7, seed=1)
    sources[3, 4:] = PAD
    sources[7, 2:] = PAD
    decoding = dict(input_ids=sources, attention_mask=(sources != PAD).long(), num_beams=4, max_new_tokens=14)
    decoding |= dict(length_penalty_type=penalty_type, logits_processor=LogitsProcessorList([SentenceBigrams()]))
    searched = {alpha: model.generate(**decoding, length_penalty=alpha) for alpha in ALPHAS}
    recorder = FinishedHypotheses()
    model.generate(**decoding, length_penalty=0.6, finished_hypotheses=recorder)
    for alpha in ALPHAS:
        rescored = recorder.best_for(alpha, penalty_type, len(sources))
        assert [tokens.tolist() for tokens in rescored] == [up_to_the_end(row) for row in searched[alpha]], alpha
    # alpha decides here: some sentences change between each neighbouring pair of alphas
    changed = [
        sum(up_to_the_end(a) != up_to_the_end(b) for a, b in zip(searched[x], searched[y], strict=True))
        for x, y in itertools.pairwise(ALPHAS)
    ]
    assert all(changed) and sum(changed) >= 5, changed


def test_one_search_serves_every_alpha_only_with_early_stopping():
    from hf_vanilla_transformer.model.decoding_vanilla_transformer import FinishedHypotheses

    model = tiny_model(seed=3)
    sources = random_ids(3, 5, seed=1)
    recorder = FinishedHypotheses()
    model.generate(input_ids=sources, num_beams=4, max_new_tokens=6, early_stopping=False, finished_hypotheses=recorder)
    with pytest.raises(ValueError, match="early_stopping=False: one search serves every alpha only with"):
        recorder.best_for(0.6, "gnmt", 3)
    with pytest.raises(ValueError, match="finished_hypotheses records a beam search; num_beams=1 is greedy"):
        model.generate(input_ids=sources, num_beams=1, max_new_tokens=6, finished_hypotheses=FinishedHypotheses())
    unused = FinishedHypotheses()
    unused.early_stopping = True
    with pytest.raises(ValueError, match=r"sentences \[0, 1, 2\] finished no hypothesis"):
        unused.best_for(0.6, "gnmt", 3)


@pytest.mark.parametrize("early_stopping", [True, False])
def test_translating_for_each_alpha_gives_each_alphas_own_translations(early_stopping):
    """`translate_each_alpha` (the run's choice of alpha: one search, every alpha) against `translate()` with each
    alpha, through the real tokenizer and batching; without early stopping it decodes each alpha on its own."""
    from hf_vanilla_transformer.evaluation.translation import translate, translate_each_alpha

    from conftest import word_tokenizer

    words = [f"w{i}" for i in range(60)]
    tokenizer = word_tokenizer(words)
    model = tiny_model(seed=3, vocab_size=len(tokenizer))
    sentences = [" ".join(words[i : i + 2 + i % 5]) for i in range(0, 40, 3)] + ["", "w7"]
    kwargs = dict(progress=False, max_sentences=5, early_stopping=early_stopping, max_new_tokens=12)
    kwargs["logits_processor"] = LogitsProcessorList([SentenceBigrams()])
    each = translate_each_alpha(model, tokenizer, sentences, ALPHAS, **kwargs)
    assert list(each) == ALPHAS
    for alpha in ALPHAS:
        assert each[alpha] == translate(model, tokenizer, sentences, length_penalty=alpha, **kwargs), alpha
    assert each[0.0] != each[3.0] and each[0.0][-2] == ""
    with pytest.raises(ValueError, match="takes its alphas in `alphas`, not `length_penalty`"):
        translate_each_alpha(model, tokenizer, sentences, ALPHAS, length_penalty=0.6)
