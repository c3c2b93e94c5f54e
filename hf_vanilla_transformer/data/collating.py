"""Training batches as the model takes them: the collator the Trainer, the calibration and the Trainer's trial share
(`training_collator`), the rows of index batches collated (`collate_rows`), and the batches a run's updates are
measured on before training (`measured_batches`)."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import DataCollatorForSeq2Seq

from ..model.modeling_vanilla_transformer import shift_tokens_right
from ..utils.device import pad_multiple
from .batching import TokenBudgetBatchSampler


def training_collator(tokenizer, config, device) -> DataCollatorForSeq2Seq:
    """The collator of the training batches, the calibration's and the Trainer's, for a model of `config` on
    `device`: padded to the longest of each side (to a multiple of 8 on CUDA: `device.pad_multiple`), the decoder
    inputs made from the labels. It holds the model's two token ids, not the model: data-loading workers get a
    copy of it."""
    multiple = pad_multiple(device)
    shifter = DecoderInputs(config.pad_token_id, config.decoder_start_token_id)
    return DataCollatorForSeq2Seq(tokenizer, model=shifter, pad_to_multiple_of=multiple if multiple > 1 else None)


@dataclass(frozen=True)
class DecoderInputs:
    """What `DataCollatorForSeq2Seq` asks of a model: the decoder inputs of a batch's labels, shifted right (§3.1)."""

    pad_token_id: int
    decoder_start_token_id: int

    def prepare_decoder_input_ids_from_labels(self, labels):
        return shift_tokens_right(labels, self.pad_token_id, self.decoder_start_token_id)


def collate_rows(train, batches: list[list[int]], collator) -> list[dict]:
    """The rows of the tokenized training split `train` in each index batch of `batches`, collated."""
    return [collator([{k: train[i][k] for k in ("input_ids", "labels")} for i in batch]) for batch in batches]


def measured_batches(sampler: TokenBudgetBatchSampler, count: int, multiple: int, taken: set) -> list[list[int]]:
    """`count` index batches of `sampler` that stand for a run's (`shape_sample`), of shapes (lengths rounded up to
    `multiple`) not in `taken` where the corpus has enough (added to it); a small corpus has too few shapes for
    each to be new, and the rest are batches of shapes already met."""
    chosen = sampler.shape_sample(count, multiple, taken)
    if len(chosen) < count:
        chosen += sampler.shape_sample(count - len(chosen), multiple)
    return chosen
