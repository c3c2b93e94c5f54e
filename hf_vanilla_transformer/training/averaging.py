"""Checkpoint averaging (§6.1): the base models average the last 5 checkpoints, the big ones the last 20."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import safe_open

from ..data.tokenizer import copy_tokenizer_files
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from ..utils.faults import moment
from .budget import reached_step
from .checkpoints import checkpoint_folders, checkpoint_step


# Average only over the last third of a run (a 5,400-update run saved every 450 averages updates 3,600-5,400) and
# never a checkpoint whose validation loss is more than 8% above the last one's. Measured in 26-minute CPU runs
# (docs/cpu_recipe.md): on an AVX2 EPYC (three runs, about 2,100-2,400 updates) averaging in a checkpoint 5-7.3% worse
# than the last was worth +0.0 to +0.4 test BLEU, one 16% worse cost 0.9; on a Zen 4 (6,203 updates, dropout 0.1) one
# 9.8% worse cost 0.5 BLEU on the 747 validation pairs (38.72 against 38.20).
AVERAGE_WINDOW = 1 / 3
WORSE_THAN_LAST = 0.08


def averaging_for(
    steps: list[tuple[float, int]], epochs: float, save_steps: int, max_steps: int, window: float
) -> tuple[int, float] | None:
    """The checkpoints a run of `epochs` epochs averages, and the fraction of the run they may come from: the count of
    the last of `steps` (the recipe's `average_last_by_epochs`, (epochs, checkpoints) pairs, fewest epochs first) it
    reaches, and the recipe's `window` widened to hold that many checkpoints `save_steps` apart back from the last one,
    at update `max_steps` (half a spacing to spare: the last 8 of 12 reach back to 37.5% of the run); None below the
    first (the recipe's `average_last` and `average_window`). The plan predicts the count from its epochs
    (`schedule.reached_step`), the end decides on those made (`finishing.averaging_of_run`). Late in a long run the
    checkpoints differ less, and more of them average to a better model; early in a short one they are far from trained
    (docs/cpu_recipe.md, "The averaging window on the curve's longer runs")."""
    last = reached_step(steps, epochs)
    if last is None:
        return None
    return last, min(1.0, max(window, (last - 0.5) * save_steps / max(1, max_steps)))


def average_state_dicts(paths: list[str | Path]) -> dict[str, torch.Tensor]:
    """Elementwise mean of the `model.safetensors` tensors of `paths` (accumulated in float64)."""
    if not paths:
        raise ValueError("No checkpoint to average.")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        file = Path(path) / "model.safetensors"
        if not file.exists():
            raise FileNotFoundError(f"{file} does not exist; is {path} a complete checkpoint?")
        with safe_open(str(file), framework="pt") as handle:
            keys = set(handle.keys())
            if total and keys != set(total):
                raise ValueError(f"{file} holds other tensors than {paths[0]}; checkpoints of different models?")
            for key in keys:
                tensor = handle.get_tensor(key)
                dtypes[key] = tensor.dtype
                value = tensor.to(torch.float64) if tensor.is_floating_point() else tensor
                total[key] = total[key] + value if key in total and tensor.is_floating_point() else value
    return {
        key: (value / len(paths)).to(dtypes[key]) if value.is_floating_point() else value
        for key, value in total.items()
    }


def average_checkpoints(
    checkpoints: list[str | Path], output_dir: str | Path
) -> VanillaTransformerForConditionalGeneration:
    """Average `checkpoints` into a model folder at `output_dir` (weights, config, generation config, remote-code
    files and the tokenizer of the last checkpoint). The three-way tie is kept: the average is loaded into a model
    and saved through `save_pretrained`."""
    checkpoints = [Path(path) for path in checkpoints]
    model = VanillaTransformerForConditionalGeneration.from_pretrained(checkpoints[-1])
    averaged = average_state_dicts(checkpoints)
    missing, unexpected = model.load_state_dict(averaged, strict=False)
    tied = set(model.all_tied_weights_keys)
    if unexpected or set(missing) - tied:
        raise ValueError(f"Averaged weights do not fit the model: missing {missing}, unexpected {unexpected}.")
    model.tie_weights()
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    moment("averaging")
    copy_tokenizer_files(checkpoints[-1], output_dir)
    return model


def choose_checkpoints(
    folders: list[Path],
    last: int = 5,
    window: float | None = AVERAGE_WINDOW,
    eval_losses: dict[int, float] | None = None,
    tolerance: float = WORSE_THAN_LAST,
) -> list[Path]:
    """The checkpoints worth averaging among a run's complete `folders` (oldest first): at most the newest `last`,
    only from the last `window` of the run (steps >= (1 - window) * the last checkpoint's step; None: no limit), and
    none clearly worse on validation: none whose loss exceeds the last one's by more than `tolerance` (relative).
    The last checkpoint is always chosen.

    `eval_losses` ({step: validation loss}) measures some checkpoints only (validation runs at every other one).
    While the loss falls, a checkpoint's loss is at least that of the next validation at or after it, so that one
    judges it (so the rule never leaves out a newer checkpoint while keeping an older, unmeasured one); and the last
    checkpoint's loss is at most that of the newest validation at or before it (a run stopped at its deadline saved
    between validations). Without a validation at or after a checkpoint, it is judged by nothing.

    Averaging is worth it only over the end of a run: checkpoints from early in a short run are far from trained,
    and averaging them in cost 7.8 BLEU in a 1,700-update run (SPEC.md, "What is known about learning")."""
    if last < 1:
        raise ValueError(f"last={last} is invalid; average at least one checkpoint.")
    if window is not None and not 0 < window <= 1:
        raise ValueError(f"average_window={window} is invalid; expected a fraction of the run in (0, 1].")
    if not folders:
        return []
    steps = [checkpoint_step(folder) for folder in folders]
    final = steps[-1]
    start = math.floor((1 - window) * final + 1e-6) if window is not None else -math.inf  # 1e-6: 2/3 * 5400
    losses = eval_losses or {}
    measured = sorted(step for step in losses if step <= final)
    reference = losses[measured[-1]] if measured else None
    chosen = []
    for folder, step in zip(folders[-last:], steps[-last:], strict=True):
        if step < start:
            continue
        judge = next((later for later in measured if later >= step), None)  # its loss is at least this one's
        if step != final and judge is not None and losses[judge] > reference * (1 + tolerance):
            continue
        chosen.append(folder)
    return chosen


def validation_losses(log_history: list[dict]) -> dict[int, float]:
    """{update: validation loss} from a `Trainer` log history (the entries with an `eval_loss`)."""
    return {int(entry["step"]): float(entry["eval_loss"]) for entry in log_history if "eval_loss" in entry}


def average_last_checkpoints(
    run_dir: str | Path,
    output_dir: str | Path,
    last: int = 5,
    window: float | None = AVERAGE_WINDOW,
    log_history: list[dict] | None = None,
):
    """Average the checkpoints `choose_checkpoints` picks among the complete ones of `run_dir` (the newest `last`
    from the end of the run, none clearly worse than the last on validation) into `output_dir`.

    Returns (model, folders)."""
    folders = checkpoint_folders(run_dir)
    if not folders:
        raise FileNotFoundError(f"{run_dir} holds no complete checkpoint-<step> folder to average.")
    chosen = choose_checkpoints(folders, last, window, validation_losses(log_history or []))
    return average_checkpoints(chosen, output_dir), chosen
