"""The model trains through the real `Seq2SeqTrainer` and `DataCollatorForSeq2Seq`."""

from __future__ import annotations

from datasets import Dataset
from transformers import (
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from conftest import logged_losses, tiny_model, word_tokenizer


def test_seq2seq_trainer_runs_and_the_loss_falls(tmp_path):
    words = [f"w{i}" for i in range(40)]
    tokenizer = word_tokenizer(words)
    model = tiny_model(vocab_size=len(tokenizer)).train()
    sources = [" ".join(words[i : i + 3 + i % 4]) for i in range(16)]
    targets = [" ".join(reversed(s.split())) for s in sources]

    def encode(batch):
        features = tokenizer(batch["source"], add_special_tokens=False)
        labels = tokenizer(batch["target"], add_special_tokens=False)["input_ids"]
        features["labels"] = [[*ids, tokenizer.eos_token_id] for ids in labels]
        return features

    dataset = Dataset.from_dict({"source": sources, "target": targets}).map(encode, batched=True)
    dataset = dataset.remove_columns(["source", "target"])
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=5,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
    )
    trainer.train()
    losses = logged_losses(trainer.state.log_history)
    assert len(losses) == 5
    assert losses[-1] < losses[0] - 0.2, losses
