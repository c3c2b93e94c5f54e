"""The model trains through the real `Seq2SeqTrainer` and `DataCollatorForSeq2Seq`."""

from __future__ import annotations

from conftest import reversal_task, tiny_model, train_on_reversal


def test_seq2seq_trainer_runs_and_the_loss_falls(tmp_path):
    tokenizer, dataset = reversal_task()
    model = tiny_model(vocab_size=len(tokenizer)).train()
    losses = train_on_reversal(model, tokenizer, dataset, tmp_path, max_steps=5, per_device_train_batch_size=16, seed=0)
    assert len(losses) == 5
    assert losses[-1] < losses[0] - 0.2, losses
