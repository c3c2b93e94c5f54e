"""The model trains through the real `Seq2SeqTrainer` and `DataCollatorForSeq2Seq`."""

from __future__ import annotations

import pytest
import torch
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

from hf_vanilla_transformer.training.trainer import TransformerTrainer

from conftest import reversal_task, tiny_model, train_on_reversal


def test_seq2seq_trainer_runs_and_the_loss_falls(tmp_path):
    tokenizer, dataset = reversal_task()
    model = tiny_model(vocab_size=len(tokenizer)).train()
    losses = train_on_reversal(model, tokenizer, dataset, tmp_path, max_steps=5, per_device_train_batch_size=16, seed=0)
    assert len(losses) == 5
    assert losses[-1] < losses[0] - 0.2, losses


@pytest.mark.parametrize(
    ("strategy", "norms_at", "logged"),
    [("steps", [1, 3, 6], [1, 3, 6]), ("epoch", [1, 2, 3, 4, 5, 6, 7], [1, 2, 4, 6, 7])],
)
def test_the_gradient_norm_is_computed_for_the_logged_updates_only_and_equals_the_trainers(
    tmp_path, strategy, norms_at, logged
):
    """Without clipping, `TransformerTrainer` computes the gradient norm only for an update it logs: the logged norms,
    the losses and the trained weights equal those of the same Trainer with transformers' own rule, which computes it
    at every update."""

    class EveryUpdate(TransformerTrainer):
        _get_grad_norm = Seq2SeqTrainer._get_grad_norm

    tokenizer, dataset = reversal_task()
    results = {}
    for name, trainer_class in (("ours", TransformerTrainer), ("transformers", EveryUpdate)):
        model = tiny_model(vocab_size=len(tokenizer)).train()
        arguments = Seq2SeqTrainingArguments(
            output_dir=str(tmp_path / name),
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            warmup_steps=4,
            max_grad_norm=0.0,
            max_steps=7,
            logging_strategy=strategy,
            logging_steps=3,
            logging_first_step=True,
            save_strategy="no",
            per_device_train_batch_size=8,
            seed=0,
        )
        trainer = trainer_class(
            model=model,
            args=arguments,
            train_dataset=dataset,
            data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
            processing_class=tokenizer,
        )
        computed = []
        original = trainer.accelerator.clip_grad_norm_

        def counting(parameters, max_norm, *rest, original=original, computed=computed, trainer=trainer):
            computed.append(trainer.state.global_step + 1)
            return original(parameters, max_norm, *rest)

        trainer.accelerator.clip_grad_norm_ = counting
        trainer.train()
        logs = [entry for entry in trainer.state.log_history if "loss" in entry]
        results[name] = (logs, computed, {k: v.clone() for k, v in model.state_dict().items()})
    (ours, ours_computed, ours_weights), (theirs, theirs_computed, theirs_weights) = results.values()
    assert theirs_computed == [1, 2, 3, 4, 5, 6, 7] and ours_computed == norms_at
    assert [entry["step"] for entry in ours] == [entry["step"] for entry in theirs] == logged
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine["grad_norm"] == reference["grad_norm"] and mine["loss"] == reference["loss"]
    for name, value in ours_weights.items():
        assert torch.equal(value, theirs_weights[name]), name


def test_floating_point_ops_count_the_parameters_once_and_equal_transformers(tmp_path):
    """The floating-point operations of an update: transformers' count for every batch, the model's parameters
    walked once however many updates are counted."""
    tokenizer, dataset = reversal_task()
    model = tiny_model(vocab_size=len(tokenizer))
    arguments = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no")
    trainer = TransformerTrainer(model=model, args=arguments, train_dataset=dataset, processing_class=tokenizer)
    walks = []
    counted = model.num_parameters

    def counting(*args, **kwargs):
        walks.append(kwargs)
        return counted(*args, **kwargs)

    model.num_parameters = counting
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    for rows in ([0, 1, 2], [3, 4], [5, 6, 7, 8]):
        batch = collator([dataset[i] for i in rows])
        expected = Seq2SeqTrainer.floating_point_ops(trainer, batch)
        assert trainer.floating_point_ops(batch) == expected > 0
    assert len(walks) == 1 + 3  # ours once, transformers' at each call
