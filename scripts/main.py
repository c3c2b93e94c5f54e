"""The README's main job: train the Transformer on the LibreOffice help EN-DE on this machine's CPU, average the
last checkpoints, evaluate sacreBLEU on the held-out test split with the paper's beam search, save the model folder
and show translations.

Usage:
    python scripts/main.py [--output_dir outputs/vanilla-transformer-en-de] [--max_steps N] [--seed 0]

The recipe is `CPU_RECIPE` in hf_vanilla_transformer.training (the paper's, scaled to a CPU budget; README.md
says why each setting differs). A restarted run resumes from its newest complete checkpoint.
"""

import argparse
import logging
import shlex
import sys
import time

from hf_vanilla_transformer.runtime import use_fast_allocator


use_fast_allocator()  # re-executes this script once with mimalloc preloaded (see runtime.py)

from hf_vanilla_transformer.training import (  # noqa: E402
    CPU_RECIPE,
    ModelDataArguments,
    TransformerTrainingArguments,
    train_and_evaluate,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="outputs/vanilla-transformer-en-de")
    parser.add_argument("--max_steps", type=int, default=CPU_RECIPE["training"]["max_steps"])
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)

    recipe = ModelDataArguments(**CPU_RECIPE["model_data"])
    training = {**CPU_RECIPE["training"], "max_steps": options.max_steps, "seed": options.seed}
    args = TransformerTrainingArguments(output_dir=options.output_dir, **training)
    started = time.time()
    print(
        f"Training the {recipe.preset!r} Transformer on the LibreOffice help EN-DE for {args.max_steps} updates "
        f"({'bf16' if args.bf16 else 'fp32'}, {args.output_dir}).",
        flush=True,
    )
    results = train_and_evaluate(recipe, args, command=shlex.join(["python", *sys.argv]))
    if results is None:  # not the main process of a multi-process launch
        return

    test = results["test"]
    print("\n" + "=" * 100)
    print(f"test sacreBLEU {test['bleu']:.2f}  ({test['bleu_signature']})")
    print(f"test chrF      {test['chrf']:.2f}  ({test['chrf_signature']})")
    print(
        f"{test['pairs']} held-out pairs, beam {test['beams']}; trained {results['training']['steps']} "
        f"updates ({results['training']['epochs']:.1f} epochs) in {results['training']['seconds'] / 60:.1f} min; "
        f"averaged {', '.join(results['averaged_checkpoints'])}"
    )
    for example in results["examples"]:
        print(
            f"\n  source:      {example['source']}\n  translation: {example['translation']}"
            f"\n  reference:   {example['reference']}"
        )
    print(
        f"\nModel folder: {args.output_dir} (model, tokenizer, results.json, README.md); "
        f"total {(time.time() - started) / 60:.1f} min"
    )


if __name__ == "__main__":
    main()
