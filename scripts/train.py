"""Train the Transformer with the paper's recipe, average the last checkpoints, and evaluate BLEU on the test split.

Usage:
    python scripts/train.py --preset tiny --max_steps 30 --output_dir runs/tiny
    python scripts/train.py --preset base --tokens_per_update 25000 --save_minutes 10 --output_dir runs/base
    python scripts/train.py --model_name_or_path runs/base --dataset libreoffice-ui --output_dir runs/ui
    python scripts/train.py --data_files train.tsv --validation_files dev.tsv --test_files test.tsv ...
    accelerate launch --num_processes 2 scripts/train.py ...

Every `Seq2SeqTrainingArguments` flag works (--max_steps, --save_steps, --seed, --bf16, --resume_from_checkpoint,
...); the defaults are the paper's (Adam 0.9/0.98/1e-9, warmup 4000, no weight decay, no clipping). With no data
flag the corpus is the LibreOffice help EN-DE. A run restarted with the same --output_dir resumes from its newest
complete checkpoint.
"""

import logging
import shlex
import sys

from hf_vanilla_transformer.runtime import use_fast_allocator


use_fast_allocator()  # re-executes this script once with mimalloc preloaded (see runtime.py)

from transformers import HfArgumentParser  # noqa: E402

from hf_vanilla_transformer.training import (  # noqa: E402
    ModelDataArguments,
    TransformerTrainingArguments,
    train_and_evaluate,
)


def main() -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    parser = HfArgumentParser((ModelDataArguments, TransformerTrainingArguments))
    recipe, args = parser.parse_args_into_dataclasses()
    results = train_and_evaluate(recipe, args, command=shlex.join(["python", *sys.argv]))
    if results is not None:  # the main process
        test = results["test"]
        print(f"\ntest sacreBLEU {test['bleu']:.2f} ({test['bleu_signature']}), chrF {test['chrf']:.2f}")
        for example in results["examples"]:
            print(f"  {example['source']}\n  -> {example['translation']}\n  (reference: {example['reference']})")
        print(f"model saved in {args.output_dir}")


if __name__ == "__main__":
    main()
