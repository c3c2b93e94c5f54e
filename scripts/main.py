"""The README's main job: train the Transformer on the LibreOffice help EN-DE within a time budget on this
machine, average the last checkpoints, evaluate sacreBLEU on the held-out test split with the paper's beam search,
save the model folder and show translations.

Usage:
    python scripts/main.py [--max_minutes 26] [--output_dir outputs/vanilla-transformer-en-de] [--seed 0] [flag ...]

It is `scripts/train.py --recipe gpu` (configs/recipes/gpu.yaml) where PyTorch sees a CUDA device, else
`scripts/train.py --recipe cpu` (configs/recipes/cpu.yaml), with the output folder above; `--recipe` and any flag of
scripts/train.py override that. The run measures an update on this machine first, then fixes the number of
updates that fits the budget and says what it chose and why. A restarted run resumes from its newest complete
checkpoint and keeps the number of updates it had fixed.
"""

from hf_vanilla_transformer.training.allocator import use_fast_allocator


use_fast_allocator()  # re-executes this script once with mimalloc preloaded (see runtime.py)

from hf_vanilla_transformer.training.cli import train_from_command_line  # noqa: E402
from hf_vanilla_transformer.training.recipes import machine_recipe  # noqa: E402


if __name__ == "__main__":
    train_from_command_line(
        default_recipe=machine_recipe(), defaults={"output_dir": "outputs/vanilla-transformer-en-de"}
    )
