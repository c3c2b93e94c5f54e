"""Decoding as §6.1: beam search with 4 beams, GNMT's length penalty, at most input length + 50 tokens per sentence.

`VanillaTransformerGenerationMixin` adds these rules to `GenerationMixin` for `VanillaTransformerForConditionalGeneration`:
`generate()` reads `relative_max_length` and `length_penalty_type`, and two beam-search hooks apply GNMT's
lp(Y) = ((5 + |Y|) / 6)^alpha. Each call's choices travel with its own arguments, never on the model. Imported
relatively by the modeling file, and copied beside it by `save_pretrained`.
"""

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, EncoderDecoderCache, StaticLayer
from transformers.generation import GenerationConfig, GenerationMixin, StoppingCriteria, StoppingCriteriaList

from .inputs_vanilla_transformer import _check_ids


LENGTH_PENALTY_TYPES = ("gnmt", "hf")  # GNMT's ((5 + |Y|) / 6)^alpha, transformers' |Y|^alpha
RELATIVE_MAX_LENGTH = 50  # §6.1: at most input length + 50 tokens


def gnmt_length_penalty(length: int | torch.Tensor, alpha: float) -> float | torch.Tensor:
    """lp(Y) = ((5 + |Y|) / 6)^alpha, the length penalty of GNMT (Wu et al. 2016) that §6.1 uses with alpha = 0.6."""
    return ((5.0 + length) / 6.0) ** alpha


class GnmtAlpha(float):
    """A `length_penalty` that asks beam search for GNMT's lp(Y) instead of transformers' |Y|^length_penalty.

    `generate()` puts it in the call's generation config; `GenerationMixin` hands `generation_config.length_penalty`
    to the beam-search hooks below, which read the rule from its type. So the rule travels with the call that chose
    it, and nothing is stored on the model: nested or concurrent `generate()` calls keep their own rules.
    """

    recorder = None  # a `FinishedHypotheses` that keeps every hypothesis this call finishes (None: none)

    def __repr__(self) -> str:
        return f"GnmtAlpha({float(self)!r})"

    def __copy__(self):  # the generation config is deep-copied: the recorder must stay the caller's
        return self

    def __deepcopy__(self, memo):
        return self


class RecordedAlpha(float):
    """transformers' |Y|^alpha penalty (`length_penalty_type="hf"`) for a call that records what it finishes."""

    recorder = None
    __copy__, __deepcopy__ = GnmtAlpha.__copy__, GnmtAlpha.__deepcopy__


class FinishedHypotheses:
    """Every hypothesis a beam search finishes while its sentence still takes one, with its log-probability and
    length, so that one search serves every alpha (`best_for`): `generate(..., finished_hypotheses=recorder)`.

    With `early_stopping=True` (§6.1's "terminate early when possible", the model's default) alpha changes nothing
    of the search but the ranking of finished hypotheses: the running beams are the best by log-probability, the
    hypotheses that finish are the top beams that end, and a sentence stops once it has `num_beams` of them, whatever
    their scores. Its result under any alpha is then the best under that alpha of what it finished. Under other
    `early_stopping` rules alpha decides when a sentence stops, and one search serves only its own alpha.
    """

    def __init__(self):
        self.parts: list[tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]] = []  # rows, log-probs, length, ids
        self.early_stopping = None

    def add(self, kwargs: dict) -> None:
        """Keep the hypotheses `_update_finished_beams` is offered at this step (`kwargs`: its arguments) that it
        may keep: the top beams that just ended, of sentences that still take one."""
        self.early_stopping = kwargs["early_stopping"]
        ended = kwargs["next_token_hits_stopping_criteria"] & kwargs["top_num_beam_mask"][None, :]
        ended = ended & kwargs["is_early_stop_heuristic_unsatisfied"]
        if kwargs["early_stopping"] is True:
            ended = ended & ~kwargs["is_sent_finished"].all(dim=-1, keepdim=True)
        rows, columns = ended.nonzero(as_tuple=True)
        if rows.numel():
            end = kwargs["cur_len"] + 1
            log_probs = kwargs["topk_log_probs"][rows, columns].float()
            ids = kwargs["topk_running_sequences"][rows, columns, :end]
            self.parts.append((rows.cpu(), log_probs.cpu(), end - kwargs["decoder_prompt_len"], ids.cpu()))

    def best_for(self, alpha: float, penalty_type: str, sentences: int) -> list[torch.Tensor]:
        """Each sentence's best finished hypothesis under `alpha` with the `penalty_type` ("gnmt" or "hf") length
        penalty: its token ids, the decoder prompt included, as `generate()` returns it (before padding)."""
        if self.early_stopping is not True:
            raise ValueError(
                f"early_stopping={self.early_stopping!r}: one search serves every alpha only with early_stopping=True."
            )
        best: list[tuple[float, torch.Tensor] | None] = [None] * sentences
        for rows, log_probs, length, ids in self.parts:
            penalty = gnmt_length_penalty(length, alpha) if penalty_type == "gnmt" else float(length) ** alpha
            for row, score, tokens in zip(rows.tolist(), (log_probs / penalty).tolist(), ids, strict=True):
                if best[row] is None or score > best[row][0]:
                    best[row] = (score, tokens)
        missing = [row for row, found in enumerate(best) if found is None]
        if missing:
            raise ValueError(f"sentences {missing} finished no hypothesis: was this recorder given to generate()?")
        return [tokens for _, tokens in best]


class RelativeMaxLengthCriteria(StoppingCriteria):
    """Stops sentence i once it has `limits[i]` new tokens: "input length + 50" (§6.1) as a per-sentence rule.

    Rows are grouped by sentence (beams and returned sequences of one sentence are consecutive), so row r belongs
    to sentence r // (rows / batch), as in every decoding loop of `GenerationMixin`.
    """

    def __init__(self, limits: torch.Tensor, prompt_length: int):
        self.limits = limits  # (B,) new tokens allowed per sentence
        self.prompt_length = prompt_length  # decoder tokens present before the first generated one

    def __call__(self, input_ids: torch.LongTensor, scores=None, **kwargs) -> torch.BoolTensor:
        per_row = self.limits.to(input_ids.device).repeat_interleave(input_ids.shape[0] // self.limits.shape[0])
        return (input_ids.shape[1] - self.prompt_length) >= per_row  # (rows,)


class BeamSearchSteps:
    """The model as beam search's loop sees it: a call of it is a decoding step (compiled, where generate() compiles
    one) that also counts the target positions the self-attention cache then holds, so that the reorder moves only
    those (`_reorder_cache`'s `filled`); everything else (the first pass, the beam-search hooks, the configuration)
    is the model's own.

    The count is read from the cache at the first reorder (one wait for the device per `generate()` call: a cache the
    caller passed may hold positions already) and then grows by each step's decoder input length, on the host.
    """

    def __init__(self, model, step):
        self._model = model
        self._step = step
        self._filled = None  # not known yet: read from the cache at the next reorder

    def __call__(self, *args, **kwargs):
        if self._filled is not None:
            new = kwargs.get("decoder_input_ids")  # always given in transformers 5.24; without it, read the cache again
            self._filled = None if new is None else self._filled + new.shape[1]
        return self._step(*args, **kwargs)

    def _reorder_cache(self, cache: Cache, beam_idx: torch.LongTensor) -> Cache:
        if self._filled is None:
            self._filled = _static_positions_held(cache)
        return self._model._reorder_cache(cache, beam_idx, filled=self._filled)

    def __getattr__(self, name: str):
        if name in ("_model", "_step", "_filled"):  # not set yet (a copy, a pickle): no endless lookup
            raise AttributeError(name)
        return getattr(self._model, name)


def _static_positions_held(cache: Cache) -> int | None:
    """The most positions a static self-attention layer of `cache` holds (a read of each layer's count), or None
    where it has no such layer."""
    stored = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
    held = [int(layer.cumulative_length) for layer in stored.layers if _written_from_the_start(layer)]
    return max(held) if held else None


def _written_from_the_start(layer) -> bool:
    """Whether `layer` is transformers' plain static layer, holding its positions in order from the first, so that
    the ones written are a prefix (a sliding-window layer rolls them), and is allocated."""
    return type(layer) is StaticLayer and layer.is_initialized


def _keys_and_values_only(layer) -> bool:
    """Whether `layer` is a static cache layer whose only per-row state is its keys and values (transformers' static
    and sliding-window layers), which beam search may reorder in place; other layers reorder themselves."""
    return isinstance(layer, StaticLayer) and type(layer).reorder_cache is CacheLayerMixin.reorder_cache


class VanillaTransformerGenerationMixin(GenerationMixin):
    """`GenerationMixin` with the length rules of §6.1 (see the module docstring)."""

    @torch.no_grad()
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor=None,
        stopping_criteria: StoppingCriteriaList | None = None,
        **kwargs,
    ):
        """`GenerationMixin.generate` with the paper's length rules on top.

        `relative_max_length=N` (default `RELATIVE_MAX_LENGTH` = 50 from the generation config; `None` turns it off) lets each sentence
        produce at most its own number of real source tokens + N; `max_new_tokens` or `max_length`, when passed,
        still cap every sentence. Without a source (no `input_ids`, `inputs_embeds` or `encoder_outputs`) the rule
        steps aside and, as in transformers' encoder-decoders, the source is BOS alone. `length_penalty_type="gnmt"`
        (default) or `"hf"` chooses how beam search normalises finished hypotheses by length, with `length_penalty`
        as alpha. Each call's choices travel with its own arguments, never on the model, so `generate()` may run
        inside another `generate()` of the same model (a logits processor, a callback, assisted decoding).
        """
        rules = {name: kwargs.pop(name) for name in ("relative_max_length", "length_penalty_type") if name in kwargs}
        recorder = kwargs.pop("finished_hypotheses", None)
        # 1. The configuration this call runs with (the model's defaults < `generation_config` < keyword arguments).
        config, _ = self._prepare_generation_config(generation_config, **kwargs)
        relative = rules.get("relative_max_length", getattr(config, "relative_max_length", None))
        penalty_type = rules.get("length_penalty_type", getattr(config, "length_penalty_type", None) or "hf")
        _check_decoding_arguments(config.num_beams, relative, penalty_type)

        # 2. "Input length + 50" (§6.1), sentence by sentence, where there is a source to measure.
        sources = self._source_lengths(inputs, kwargs)  # (B,) or None; checks the source ids
        if kwargs.get("decoder_input_ids") is not None:  # checked once here: a compiled step does not check
            _check_ids("decoder_input_ids", kwargs["decoder_input_ids"], self.config.vocab_size)
        if relative is not None and sources is not None:
            limits = sources + relative  # (B,)
            criteria = StoppingCriteriaList([self._relative_length_criteria(limits, kwargs)])
            stopping_criteria = criteria + (stopping_criteria or [])
            user_cap = (
                config.max_new_tokens is not None
                or kwargs.get("max_length") is not None
                or (generation_config is not None and generation_config.max_length is not None)
                or self.generation_config.max_length is not None
            )
            if not user_cap:
                kwargs["max_new_tokens"] = int(limits.max())

        # 3. GNMT's length penalty in beam search, carried by the value of this call's `length_penalty`, and with it
        # the recorder of the hypotheses it finishes where one is given (`FinishedHypotheses`).
        if config.num_beams > 1 and (penalty_type == "gnmt" or recorder is not None):
            alpha = config.length_penalty if config.length_penalty is not None else 1.0
            kwargs["length_penalty"] = (GnmtAlpha if penalty_type == "gnmt" else RecordedAlpha)(alpha)
            kwargs["length_penalty"].recorder = recorder
        elif recorder is not None:
            raise ValueError(f"finished_hypotheses records a beam search; num_beams={config.num_beams} is greedy.")
        return super().generate(
            inputs,
            generation_config=generation_config,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            **kwargs,
        )

    def _relative_length_criteria(self, limits: torch.Tensor, kwargs: dict) -> RelativeMaxLengthCriteria:
        """The stopping rule for `limits` (B,) new tokens, counted after the decoder prompt (the start token, or the
        caller's `decoder_input_ids`, to which generate() prepends the start token when it is not there)."""
        prompt = kwargs.get("decoder_input_ids")
        prompt_length = 1
        if prompt is not None:
            starts_right = bool((prompt[:, 0] == self.config.decoder_start_token_id).all())
            prompt_length = prompt.shape[1] + (0 if starts_right else 1)
        return RelativeMaxLengthCriteria(limits, prompt_length)

    def _reorder_cache(self, cache: Cache, beam_idx: torch.LongTensor, filled: int | None = None) -> Cache:
        """Beam search: follow the surviving beams in the self-attention cache only.

        Every beam of a sentence attends to the same encoder output, so the cross-attention keys and values of its
        beams are identical rows and `beam_idx` (which picks beams within each sentence) would copy them onto
        themselves: decoder_layers x 2 tensors of (batch x beams, heads, source length, d_k) per step, for nothing.
        A static layer is reordered in place: a compiled decoding step (CUDA graphs) reads its tensors at the
        addresses it was captured with, where transformers' reorder would put new tensors and ask the host whether
        the layer holds anything (a wait per layer and step). With `filled` (at least the number of target positions
        cached so far), only those positions of a static layer move: the others are not written yet, and a static
        layer is as long as the longest translation allowed.
        """
        stored = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        for layer in stored.layers:
            if not _keys_and_values_only(layer):
                layer.reorder_cache(beam_idx)
            elif layer.is_initialized:
                rows = beam_idx.to(layer.keys.device)
                length = filled if filled is not None and _written_from_the_start(layer) else layer.keys.shape[2]
                for states in (layer.keys, layer.values):
                    positions = states[:, :, :length]
                    positions.copy_(positions.index_select(0, rows))
        return cache

    @staticmethod
    def _gather_beams(tensor: torch.Tensor, beam_indices: torch.Tensor) -> torch.Tensor:
        """transformers' gather of whole beams, (batch, beams, ...) picked by `beam_indices` (batch, k), as one
        `gather`: its `take_along_dim` also wraps negative indices (a `remainder` kernel per call, nine calls a
        beam-search step), which beam indices never are. Any other shape of index goes to transformers' own."""
        if beam_indices.dim() != 2 or beam_indices.shape[0] != tensor.shape[0]:
            return GenerationMixin._gather_beams(tensor, beam_indices)
        trailing = tensor.shape[2:]
        index = beam_indices.view(*beam_indices.shape, *(1,) * len(trailing)).expand(*beam_indices.shape, *trailing)
        return tensor.gather(1, index)

    def _beam_search(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False, **kw):
        """transformers' beam search with its decoding steps compiled wherever generate() would compile greedy
        search's (`_valid_auto_compile_criteria`: a static cache, and an accelerator or a `compile_config` that
        compiles on every device): transformers 5 compiles only greedy search and sampling, and its beam search ran
        the static cache eagerly, slower than the dynamic one. The first pass (which fills the cross-attention
        cache) stays eager, as in greedy search. The loop sees the model through `BeamSearchSteps`, which counts the
        cached positions for the reorder."""
        if self._valid_auto_compile_criteria(kw, generation_config):
            step = self.get_compiled_call(generation_config.compile_config)
        else:
            step = self.__call__
        return GenerationMixin._beam_search(
            BeamSearchSteps(self, step),
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            synced_gpus,
            **kw,
        )

    def _source_lengths(self, inputs: torch.Tensor | None, kwargs: dict) -> torch.Tensor | None:
        """Real (non-padding) source tokens per sentence: from the attention mask, else from the padding id, else the
        full length of `inputs_embeds` or of the encoder output; None when the call has no source."""
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 2:
            return mask.sum(-1).long()
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        if ids is not None:
            _check_ids("input_ids", ids, self.config.encoder_vocab_size())
            return (ids != self.config.pad_token_id).sum(-1).long()
        states = kwargs.get("inputs_embeds")
        if states is None and kwargs.get("encoder_outputs") is not None:
            states = kwargs["encoder_outputs"][0]
        if states is None:
            return None
        return torch.full((states.shape[0],), states.shape[1], dtype=torch.long, device=states.device)

    def _update_finished_beams(self, **kwargs):
        # GNMT: finished hypotheses are ranked by log P(Y) / ((5 + |Y|) / 6)^alpha; HF would divide by |Y|^alpha.
        alpha = kwargs["length_penalty"]
        if getattr(alpha, "recorder", None) is not None:
            alpha.recorder.add(kwargs)
        if isinstance(alpha, RecordedAlpha):
            kwargs["length_penalty"] = float(alpha)
        if isinstance(alpha, GnmtAlpha):
            length = kwargs["cur_len"] + 1 - kwargs["decoder_prompt_len"]
            kwargs["topk_log_probs"] = kwargs["topk_log_probs"] / gnmt_length_penalty(length, float(alpha))
            kwargs["length_penalty"] = 0.0
        return super()._update_finished_beams(**kwargs)

    def _check_early_stop_heuristic(self, **kwargs):
        # The same bound as HF's, with GNMT's penalty: for early_stopping="never" the best a running hypothesis can
        # still reach is its score divided by lp(longest allowed length), as in tensor2tensor's `stop_early`.
        alpha = kwargs["length_penalty"]
        if isinstance(alpha, RecordedAlpha):
            kwargs["length_penalty"] = float(alpha)
        if isinstance(alpha, GnmtAlpha):
            longest = kwargs["early_stopping"] == "never" and alpha > 0.0
            length = (kwargs["max_length"] if longest else kwargs["cur_len"]) - kwargs["decoder_prompt_len"]
            kwargs["running_beam_scores"] = kwargs["running_beam_scores"] / gnmt_length_penalty(length, float(alpha))
            kwargs["length_penalty"] = 0.0
        return GenerationMixin._check_early_stop_heuristic(**kwargs)


def _check_decoding_arguments(num_beams, relative_max_length, length_penalty_type) -> None:
    """Raise a ValueError naming the value when one of generate()'s arguments is out of its range."""
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(
            f"num_beams={num_beams!r} is invalid; expected an integer >= 1 (1: greedy search or sampling, more: "
            "beam search)."
        )
    if length_penalty_type not in LENGTH_PENALTY_TYPES:
        raise ValueError(
            f"length_penalty_type={length_penalty_type!r} is invalid; expected one of {LENGTH_PENALTY_TYPES}."
        )
    if relative_max_length is not None and (
        isinstance(relative_max_length, bool) or not isinstance(relative_max_length, int) or relative_max_length < 0
    ):
        raise ValueError(f"relative_max_length={relative_max_length!r} is invalid; expected None or an integer >= 0.")


def default_generation_config(config) -> GenerationConfig:
    """The paper's decoding (§6.1) as the default of every new and saved model.

    Beam search with 4 beams; hypotheses ranked by log P(Y) / lp(Y) with GNMT's lp(Y) = ((5 + |Y|) / 6)^0.6
    (`length_penalty_type="gnmt"`, `length_penalty=0.6`); at most input length + 50 tokens per sentence
    (`relative_max_length=50`); a sentence's search ends once it has 4 finished hypotheses (`early_stopping=True`).
    """
    return GenerationConfig(
        num_beams=4,
        length_penalty=0.6,
        length_penalty_type="gnmt",
        relative_max_length=RELATIVE_MAX_LENGTH,
        early_stopping=True,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
    )
