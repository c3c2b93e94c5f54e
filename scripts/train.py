"""Train the Transformer with the paper's recipe, average the last checkpoints, and evaluate BLEU on the test split.

Usage:
    python scripts/train.py --recipe cpu --max_minutes 30 --output_dir runs/en-de
    python scripts/train.py --recipe cpu --data_files mine.tsv --max_minutes 30 --output_dir runs/mine
    python scripts/train.py --preset tiny --max_steps 30 --output_dir runs/tiny
    python scripts/train.py --recipe base --output_dir runs/base          # the paper's base (WMT 2014, GPUs)
    python scripts/train.py --model_name_or_path runs/base --dataset libreoffice-ui --output_dir runs/ui
    python scripts/train.py --data_files train.tsv --validation_files dev.tsv --test_files test.tsv ...
    accelerate launch --num_processes 2 scripts/train.py ...

A recipe (configs/recipes/cpu.yaml, base.yaml, big.yaml, or a file of your own) sets defaults; every flag overrides
it, and every `Seq2SeqTrainingArguments` flag works (--max_steps, --seed, --bf16, --resume_from_checkpoint, ...).
Without a recipe the defaults are the paper's (Adam 0.9/0.98/1e-9, warmup 4000, no weight decay, no clipping).
`--max_minutes M` measures an update on this machine and fixes the number of updates that fits M minutes. With no
data flag the corpus is the LibreOffice help EN-DE. A run restarted with the same --output_dir resumes from its
newest complete checkpoint.
"""

from hf_vanilla_transformer.training.allocator import use_fast_allocator


use_fast_allocator()  # re-executes this script once with mimalloc preloaded (see runtime.py)

from hf_vanilla_transformer.training.cli import train_from_command_line  # noqa: E402


if __name__ == "__main__":
    train_from_command_line()
