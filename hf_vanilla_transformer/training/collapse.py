"""The guard against a model that stopped using its source.

A post-LN Transformer trained with too high a learning rate can fall into a state where its decoder ignores the
encoder: it becomes a language model of the target side, every test sentence gets the same translation, and the
training loss still falls (the base model on the GPU at 1.98e-3: 3,801 updates, training loss 7.76 -> 2.51,
validation loss flat at 5.2-5.4, every sentence translated as "Tastatur: +A", test BLEU 0.00).

At each validation the Trainer measures how much the model's predictions depend on their source: the validation
loss with the real sources, and with each batch's sources rolled by one (every target paired with another sentence
of about the same length: the batches are sorted by length). A model that translates loses several nats per target
token when given the wrong source; one that collapsed loses nothing. A gain below `SOURCE_GAIN_AT_LEAST` nats per
token after warmup is said in the log at once: a model learns the target side first and may take a while after
warmup to read its source. The source worth nothing at all (below `NOTHING_BELOW`) at the run's last validation, or,
with `--source_check stop` (the default), at `LOW_IN_A_ROW` validations in a row after warmup, is a collapse:
recorded in `results.json` and the model card, training ended there, and the run fails with the cause and a remedy.
(A model still reading its source a little at its end was only trained too short: it is said, not failed.)

A model is judged only once it has seen `JUDGED_AFTER_EPOCHS` of its corpus: before, one that reads nothing of its
source has not begun to, it has not stopped (a 6-minute run on an AVX2 laptop, 252 updates, a quarter of an epoch,
was failed as a collapse, with the advice to lower a rate that was not the cause). Measured on the LibreOffice
corpus (`compact`, 925 updates an epoch): a gain of 0.002 nats at 0.22 epochs, 0.07 at 0.43, 0.24 at 0.65 and 1.37
at 1.56 (docs/cpu_recipe.md, "The recipe at other budgets").

Measured on a tiny model (d_model 32) trained 200-300 updates on an artificial word-for-word language pair
(tests/test_collapse.py): driven into the collapse (lr_scale 1.5) its gain stays within 0.001 of zero at every
validation, seed after seed; at lr_scale 0.15-0.3 it gains 0.01-0.05 nats in its first validations after warmup,
then 0.9-5.9 by the end.
"""

from __future__ import annotations

import logging
import math

import torch
from transformers import TrainerCallback


logger = logging.getLogger(__name__)

# Nats per target token the real source must be worth at the run's last validation (and is said to be worth too
# little at any validation after warmup): a model that translates gains whole nats.
SOURCE_GAIN_AT_LEAST = 0.1
# Below this the source is worth nothing at all: `LOW_IN_A_ROW` such validations in a row after warmup end a run with
# `--source_check stop` before its end (a collapsed model stays within 0.001 of zero; a slow one gains 0.01 and more).
NOTHING_BELOW = 0.01
LOW_IN_A_ROW = 3
# The epochs of its corpus a model is trained before a source worth nothing is judged a collapse (and before
# validations that do not raise its best BLEU count towards a plateau: callbacks.PlateauCallback).
JUDGED_AFTER_EPOCHS = 1.0


class SourceCollapseError(RuntimeError):
    """A run whose model stopped using its source: the message names the measurement and a remedy."""


@torch.no_grad()
def source_dependence(model, batches, autocast, reduce) -> dict[str, float] | None:
    """The validation loss per target token with the real sources and with each batch's sources rolled by one, over
    `batches` of at least two pairs (`autocast()`: the evaluation's precision context; `reduce(tensor)`: the sum
    over the processes of a launch, which every process calls, whatever its shard holds); None where no batch has
    two pairs."""
    totals = torch.zeros(3, device=next(model.parameters()).device)
    for batch in batches:
        if batch["input_ids"].shape[0] < 2:
            continue
        tokens = (batch["labels"] != -100).sum()
        rolled = {key: batch[key].roll(1, dims=0) for key in ("input_ids", "attention_mask") if key in batch}
        with autocast():
            real = model(**batch).loss.float() * tokens
            shuffled = model(**{**batch, **rolled}).loss.float() * tokens
        totals += torch.stack([real, shuffled, tokens.float()])
    real, shuffled, tokens = reduce(totals).tolist()
    if tokens == 0:
        return None
    return {
        "loss": real / tokens,
        "loss_shuffled_sources": shuffled / tokens,
        "source_gain": (shuffled - real) / tokens,
    }


class SourceCheckCallback(TrainerCallback):
    """Judges each validation's source dependence (the Trainer's `eval_source_gain`): a gain below
    `SOURCE_GAIN_AT_LEAST` after warmup is logged; one below `NOTHING_BELOW` at the run's last validation, or (`mode`
    "stop") at `LOW_IN_A_ROW` validations in a row, is a collapse, logged loudly; with "stop", training ends there.
    Only validations after warmup and after `JUDGED_AFTER_EPOCHS` epochs of `updates_per_epoch` updates (None: from
    warmup on) are judged. `history` keeps every measurement, `collapsed_at` the update of the first collapse."""

    def __init__(self, mode: str = "stop", updates_per_epoch: int | None = None):
        self.mode, self.updates_per_epoch = mode, updates_per_epoch
        self.history: list[dict] = []
        self.collapsed_at: int | None = None

    def judged(self, step: int, warmup_steps: float) -> bool:
        """Whether a validation after update `step` is judged: after warmup (at its last warmup update the rate
        just peaked) and after `JUDGED_AFTER_EPOCHS` epochs."""
        epochs = step / self.updates_per_epoch if self.updates_per_epoch else math.inf
        return step > warmup_steps and epochs >= JUDGED_AFTER_EPOCHS

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not metrics or "eval_source_gain" not in metrics:
            return control
        entry = {
            "step": state.global_step,
            "loss": metrics["eval_source_loss"],
            "loss_shuffled_sources": metrics["eval_loss_shuffled_sources"],
            "source_gain": metrics["eval_source_gain"],
        }
        judged = self.judged(state.global_step, args.warmup_steps)
        entry["low"] = judged and entry["source_gain"] < SOURCE_GAIN_AT_LEAST
        entry["nothing"] = judged and entry["source_gain"] < NOTHING_BELOW
        self.history.append(entry)
        last = control.should_training_stop or state.global_step >= state.max_steps
        if not judged and last and self.updates_per_epoch and entry["source_gain"] < SOURCE_GAIN_AT_LEAST:
            epochs = state.global_step / self.updates_per_epoch
            logger.warning(
                "the run ends at update %s, %.2f epochs of its corpus, before its model read its source (%.3f nats "
                "per token): too few updates to translate; give it more minutes",
                f"{state.global_step:,}",
                epochs,
                entry["source_gain"],
            )
        if not entry["low"] or self.collapsed_at is not None:
            return control
        in_a_row = len(self.history) >= LOW_IN_A_ROW and all(e["nothing"] for e in self.history[-LOW_IN_A_ROW:])
        if not (entry["nothing"] and last) and not (self.mode == "stop" and in_a_row):
            logger.warning(
                "validation at update %s: the real source is worth %.3f nats per token (below %s): the model %s",
                f"{state.global_step:,}",
                entry["source_gain"],
                SOURCE_GAIN_AT_LEAST,
                "ends reading its source very little" if last else "does not read its source yet",
            )
            return control
        self.collapsed_at = state.global_step
        logger.error("%s", collapse_message(entry, args.output_dir, self.mode))
        if self.mode == "stop":
            control.should_training_stop = True
            control.should_save = True
        return control

    def record(self) -> dict:
        """What results.json keeps: the rule, every measurement and the first collapse."""
        return {
            "mode": self.mode,
            "gain_at_least": SOURCE_GAIN_AT_LEAST,
            "nothing_below": NOTHING_BELOW,
            "judged_after_epochs": JUDGED_AFTER_EPOCHS,
            "updates_per_epoch": self.updates_per_epoch,
            "collapsed_at": self.collapsed_at,
            "history": self.history,
        }


def collapse_message(entry: dict, output_dir: str, mode: str = "stop") -> str:
    """The collapse in one paragraph: what was measured, what it means, what to do."""
    ending = {
        "stop": f"training stopped there; the model folder {output_dir} is kept for inspection",
        "warn": "the run goes on (--source_check warn)",
    }.get(mode, "")
    return (
        f"the model stopped using its source at update {entry['step']:,}: validation loss "
        f"{entry['loss']:.3f} with the real sources and {entry['loss_shuffled_sources']:.3f} with them shuffled "
        f"(a gain of {entry['source_gain']:.3f} nats per token, below {NOTHING_BELOW}): it translates every "
        "sentence alike. Lower the peak learning rate (--lr_scale 0.5, or --peak_learning_rate) or warm up longer "
        f"(--warmup_steps){'; ' + ending if ending else ''}."
    )
