"""A translation pipeline for encoder-decoder models: `pipeline("translation", model=...)`.

transformers 5 removed its translation pipeline. Importing `hf_vanilla_transformer` registers this one under the
task name "translation"; a model folder prepared for the Hub (scripts/push_to_hub.py) carries this file and names
it in `config.json` (`custom_pipelines`), so that `pipeline("translation", model=repo, trust_remote_code=True)`
works without this package. Like the modeling file, it imports nothing but torch and transformers.

    >>> translator = pipeline("translation", model="outputs/vanilla-transformer-en-de")
    >>> translator("Choose Format - Cells.")
    [{'translation_text': 'Wählen Sie Format - Zellen.'}]
    >>> translator(["Open a document.", "Save it."], batch_size=8, num_beams=1)
    [{'translation_text': ...}, {'translation_text': ...}]
"""

from __future__ import annotations

from transformers import Pipeline


class VanillaTranslationPipeline(Pipeline):
    """Text in, `[{"translation_text": ...}]` out; generation keywords (num_beams, max_new_tokens, ...) pass
    through to `model.generate`, whose defaults are the model's (the paper's beam search for this package)."""

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _pipeline_calls_generate = True

    def _sanitize_parameters(self, clean_up_tokenization_spaces=None, truncation=None, **generate_kwargs):
        preprocess = {"truncation": truncation} if truncation is not None else {}
        postprocess = {}
        if clean_up_tokenization_spaces is not None:
            postprocess["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess, generate_kwargs, postprocess

    def __call__(self, inputs, *args, **kwargs):
        """A string gives a list of dicts, one per returned sequence (one unless `num_return_sequences` says more);
        a list of strings gives one such dict per string, or a list of them per string with several sequences.
        Empty and whitespace-only strings translate to empty strings without running the model."""
        if isinstance(inputs, tuple):
            inputs = list(inputs)  # Pipeline batches lists only; it would hand a tuple to preprocess as one input
        if isinstance(inputs, str) and not inputs.strip():
            return self._blank(kwargs)
        if not isinstance(inputs, list):
            return super().__call__(inputs, *args, **kwargs)
        if not inputs:
            return []  # Pipeline looks at inputs[0] to tell chats apart
        if not all(isinstance(text, str) for text in inputs):  # before any sentence is translated
            raise TypeError("The translation pipeline takes a string or a list of strings.")
        texts = [i for i, text in enumerate(inputs) if text.strip()]  # the others need no model
        translated = super().__call__([inputs[i] for i in texts], *args, **kwargs) if texts else []
        results = [self._blank(kwargs) for _ in inputs]
        for index, result in zip(texts, translated, strict=True):
            results[index] = result
        return [result[0] for result in results] if all(len(result) == 1 for result in results) else results

    def _blank(self, call_kwargs: dict) -> list[dict]:
        """The result of a blank input: as many empty translations as the call asks for sequences."""
        sequences = call_kwargs.get("num_return_sequences", self._forward_params.get("num_return_sequences"))
        if sequences is None:
            sequences = getattr(self.model.generation_config, "num_return_sequences", None)
        return [{"translation_text": ""} for _ in range(sequences or 1)]

    def preprocess(self, text: str, truncation: bool = False):
        if not isinstance(text, str):
            raise TypeError(f"The translation pipeline takes strings; got {type(text).__name__}.")
        return self.tokenizer(text, return_tensors="pt", truncation=truncation)

    def _forward(self, model_inputs, **generate_kwargs):
        if hasattr(self, "_prepare_generate_kwargs"):  # adds what was passed to pipeline(...) itself
            generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        sources = model_inputs["input_ids"].shape[0]
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)  # (sources * sequences, length)
        # (sources, sequences, length): the pipeline splits batches along the first dimension, one source each.
        return {"output_ids": output_ids.reshape(sources, -1, output_ids.shape[-1])}

    def postprocess(self, model_outputs, clean_up_tokenization_spaces: bool = False):
        return [
            {
                "translation_text": self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                ).strip()
            }
            for ids in model_outputs["output_ids"][0]
        ]
