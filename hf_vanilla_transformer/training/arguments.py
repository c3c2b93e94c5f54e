"""The arguments of a training run: the model, data and recipe fields (`ModelDataArguments`) and the paper's optimizer
defaults on top of `Seq2SeqTrainingArguments` (`TransformerTrainingArguments`); their checks: `checks.py`."""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass, field

from transformers import (
    Seq2SeqTrainingArguments,
)

from ..model.configuration_vanilla_transformer import PRESETS
from ..utils.redact import is_secret_flag
from .averaging import AVERAGE_WINDOW


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelDataArguments:
    """What to train and on what: model size, corpus, vocabulary, sequence limits. Frozen: a run reads it as given
    (`dataclasses.replace` makes another)."""

    preset: str = field(default="small", metadata={"help": f"Model size: one of {sorted(PRESETS)}."})
    preset_choices: str | None = field(
        default=None,
        metadata={
            "help": "With --max_minutes: comma-separated presets to choose from by measured speed, largest first (e.g. "
            "big,base,small): the first that reaches --min_updates updates in the budget (at one of "
            "--max_tokens_choices), else the last. Given on the command line, its first is the preset; a recipe "
            "file's list gives way to a --preset of the command line."
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "Change the preset's sizes, as 'name=value' pairs separated by commas, e.g. "
            "'d_model=192,encoder_ffn_dim=768,decoder_ffn_dim=768' (any field of VanillaTransformerConfig)."
        },
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Fine-tune this saved model (folder or Hub id) with its own tokenizer instead of a preset."},
    )
    dataset: str = field(
        default="libreoffice-help",
        metadata={
            "help": "libreoffice-help (default), libreoffice-ui, libreoffice-help-ui (the help with the UI strings' "
            "training messages: the cpu recipe's), debian-messages (command-line tools' messages), or wmt14 (from the "
            "Hugging Face Hub, or offline from --wmt14_dir)."
        },
    )
    wmt14_dir: str | None = field(
        default=None,
        metadata={
            "help": "With --dataset wmt14: a local copy of the Hub's wmt/wmt14 parquet files (the folder `hf download "
            'wmt/wmt14 --repo-type dataset --include "de-en/*" --local-dir DIR` writes), read offline.'
        },
    )
    source_lang: str = field(default="en", metadata={"help": "Source language code."})
    target_lang: str = field(default="de", metadata={"help": "Target language code (e.g. de, fr)."})
    data_files: str | None = field(
        default=None, metadata={"help": "Local training pairs: a TSV, a JSONL, or 'src.txt,tgt.txt'."}
    )
    validation_files: str | None = field(
        default=None,
        metadata={
            "help": "Local validation pairs, as data_files. Without them, 1,000 pairs of the training file (at most 5%%) "
            "are held out for validation, drawn with a fixed seed."
        },
    )
    test_files: str | None = field(
        default=None,
        metadata={"help": "Local test pairs, as data_files. Without them, as many are held out for the test."},
    )
    publish_examples: bool = field(
        default=False,
        metadata={
            "help": "Put test sentences of your own --data_files in the model folder (results.json, the card, the "
            "attention maps): off by default, your data stays private (docs/security.md). A public corpus's are."
        },
    )
    data_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where corpora, learned BPEs and tokenized splits are cached (default: $HF_VANILLA_TRANSFORMER_DATA "
            "or ~/.cache/hf_vanilla_transformer)."
        },
    )
    bpe_sample_pairs: int | None = field(
        default=2_000_000,
        metadata={
            "help": "The BPE learns from at most this many training pairs (both sides), drawn with a fixed seed."
        },
    )
    preprocessing_num_workers: int | None = field(
        default=None,
        metadata={
            "help": "Processes that tokenize the training split (default: one per core, up to 8, from 200,000 pairs; "
            "one below)."
        },
    )
    vocab_size: int = field(default=8000, metadata={"help": "Size of the shared BPE vocabulary (§5.1)."})
    max_length: int = field(default=256, metadata={"help": "Training pairs longer than this (tokens) are dropped."})
    max_tokens: int = field(
        default=4096, metadata={"help": "Padded source tokens (and as many target tokens) per batch (§5.1)."}
    )
    tokens_per_update: int | None = field(
        default=None,
        metadata={"help": "Source tokens per update; sets gradient accumulation (the paper: 25000 per step)."},
    )
    lr_scale: float = field(default=1.0, metadata={"help": "Factor on the §5.3 learning-rate schedule."})
    dropout: float | None = field(default=None, metadata={"help": "Override P_drop of the preset."})
    label_smoothing: float | None = field(default=None, metadata={"help": "Override epsilon_ls (0.1)."})
    save_minutes: float | None = field(
        default=None, metadata={"help": "Also save a checkpoint every this many minutes (the paper: 10)."}
    )
    average_last: int = field(
        default=5, metadata={"help": "Average the last N checkpoints into the final model (§6.1); 1 keeps the last."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Evaluate on at most this many validation pairs during training."}
    )
    test_beams: int = field(default=4, metadata={"help": "Beam size for the final test evaluation (§6.1: 4)."})
    length_penalty_choices: str | None = field(
        default=None,
        metadata={
            "help": "Comma-separated GNMT alphas (e.g. 0.6,1.0,1.4) to choose from by BLEU on the validation pairs "
            "(max_eval_samples of them, beam search with test_beams) after averaging, as §6.1 chose alpha on the "
            "development set; the choice goes into the model's generation config. Default: the paper's 0.6."
        },
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "eager, sdpa or flash_attention_2 (default: transformers' choice, sdpa); auto: the faster of eager "
            "and sdpa, measured on this machine before training."
        },
    )
    recipe: str | None = field(
        default=None,
        metadata={
            "help": "A recipe shipped with the package by name (cpu, gpu, base, big), or a YAML/JSON file of flags; "
            "flags override its values."
        },
    )
    max_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Time budget of the whole run in minutes (set-up, training, test decoding): the number of updates "
            "is measured to fit it, unless --max_steps is given."
        },
    )
    compile_training: str = field(
        default="auto",
        metadata={
            "help": "Compile the training step with torch.compile: always, never, or auto (measured against eager on a "
            "CUDA device where the run trains for an hour or more, or for a given number of updates; eager on a "
            "CPU, where it measured slower). --torch_compile true is always.",
            "choices": ["auto", "always", "never"],
        },
    )
    precision: str | None = field(
        default=None,
        metadata={
            "help": "fp32, bf16 (autocast), and on CUDA also fp16 (autocast, loss scale) or tf32 (fp32 with TensorFloat-32 "
            "matrix products) (default: --bf16 / --fp16); auto: the fastest measured on this machine (on a CPU, bf16 "
            "only where it has bf16 matrix units). An explicit --bf16 overrides auto.",
            "choices": ["auto", "bf16", "fp16", "tf32", "fp32"],
        },
    )
    peak_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Scale the §5.3 schedule so that the model of --peak_learning_rate_preset peaks at this rate (sets "
            "lr_scale from it and the warmup); any other size gets the same schedule, scaled by its d_model^-0.5."
        },
    )
    peak_learning_rate_preset: str | None = field(
        default=None,
        metadata={
            "help": "The model size --peak_learning_rate was set for (default: --preset; a recipe file's peak belongs "
            "to the recipe's own preset)."
        },
    )
    lr_reference_tokens: int | None = field(
        default=None,
        metadata={
            "help": "The source tokens per update at which the rate (--lr_scale or --peak_learning_rate) holds: an "
            "update of another size scales the peak by the square root of its tokens over this (default: no "
            "scaling)."
        },
    )
    checkpoints_per_run: int | None = field(
        default=None,
        metadata={"help": "Save this many evenly spaced checkpoints over the run (instead of save_steps)."},
    )
    evaluations_per_run: int | None = field(
        default=None, metadata={"help": "Validate this many times over the run (instead of eval_steps)."}
    )
    max_tokens_choices: str | None = field(
        default=None,
        metadata={
            "help": "Comma-separated max_tokens to choose from by measured speed (e.g. 2048,1024): the largest that "
            "still gives --min_updates updates in the budget, else the smallest."
        },
    )
    min_updates: int | None = field(
        default=None,
        metadata={
            "help": "With --preset_choices or --max_tokens_choices: the updates a budgeted run should reach (a "
            "size or batch that gives fewer is passed over for the next)."
        },
    )
    size_min_updates: str | None = field(
        default=None,
        metadata={
            "help": "With --preset_choices: sizes that need more updates than --min_updates before the plan takes "
            "them, as size:updates pairs (e.g. base:12000,medium:6000): a larger model only where the budget gives "
            "it that many."
        },
    )
    dropout_by_epochs: str | None = field(
        default=None,
        metadata={
            "help": "The run's dropout from the epochs its plan predicts (a budget's, or a given length's), as "
            "epochs:dropout pairs (e.g. 12:0.1: 0.1 from 12 epochs on; below the first, --dropout or the size's own); "
            "a --dropout given on the command line (or by a recipe over the one that holds this) turns it off."
        },
    )
    average_last_by_epochs: str | None = field(
        default=None,
        metadata={
            "help": "The checkpoints averaged from the epochs the run made, as epochs:checkpoints pairs (e.g. 20:8: "
            "a run of 20 epochs or more averages its last 8, its --average_window widened to hold them; "
            "below the first, --average_last and --average_window); an --average_last or --average_window given on "
            "the command line (or by a recipe over the one that holds this) turns it off."
        },
    )
    peak_by_start_bleu: str | None = field(
        default=None,
        metadata={
            "help": "Fine-tuning: the peak learning rate from the starting model's validation BLEU (greedy, measured "
            "before the first update), as bleu:peak pairs (e.g. 20:8e-4: a start below 20 gets 8e-4; at or above "
            "every bound, --peak_learning_rate); a --peak_learning_rate given on the command line (or by a recipe "
            "over the one that holds this) turns it off."
        },
    )
    warmup_by_start_bleu: str | None = field(
        default=None,
        metadata={
            "help": "Fine-tuning: the warmup from the starting model's validation BLEU, as bleu:updates pairs (e.g. "
            "20:1000: a start below 20 warms up for 1,000 updates; at or above every bound, --warmup_steps); a "
            "--warmup_steps given on the command line (or by a recipe over the one that holds this) turns it off."
        },
    )
    plateau_validations: int | None = field(
        default=None,
        metadata={
            "help": "Stop training once this many validations in a row have not raised the best validation BLEU "
            "(default: never; the run then ends at its budget or length)."
        },
    )
    max_warmup_fraction: float | None = field(
        default=None, metadata={"help": "Never warm up for more than this fraction of the run."}
    )
    cut_warmup_keeps_peak: bool = field(
        default=False,
        metadata={
            "help": "A warmup cut by --max_warmup_fraction climbs to the full peak (true) or the §5.3 ramp's value "
            "there, a lower peak (false)."
        },
    )
    max_epochs: float | None = field(
        default=None, metadata={"help": "Never plan more updates than this many epochs of the training split."}
    )
    average_window: float = field(
        default=AVERAGE_WINDOW,
        metadata={"help": "Average only checkpoints from this last fraction of the run (the last one always)."},
    )
    source_check: str = field(
        default="stop",
        metadata={
            "help": "At each validation, compare the loss with each batch's sources moved one pair along against "
            "the real one; judged after warmup and after the run's first epoch: a model whose translations do not "
            "depend on its source by then has collapsed. stop: end training there and fail the run; warn: say so "
            "and go on; off: do not measure.",
            "choices": ["stop", "warn", "off"],
        },
    )
    scale_vocab_to_corpus: bool = field(
        default=False,
        metadata={
            "help": "Cap vocab_size at a quarter of the training split's distinct words (rounded down to 500, at least "
            "1000): a small corpus cannot fill a large vocabulary."
        },
    )


@dataclass
class TransformerTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` with the paper's defaults (§5.3) instead of transformers' ones."""

    output_dir: str | None = field(default="runs/transformer", metadata={"help": "Where checkpoints and the model go."})
    adam_beta2: float = field(default=0.98, metadata={"help": "Adam beta2 (§5.3: 0.98)."})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam epsilon (§5.3: 1e-9)."})
    weight_decay: float = field(default=0.0, metadata={"help": "No weight decay in the paper."})
    max_grad_norm: float = field(default=0.0, metadata={"help": "No gradient clipping in the paper (0 = off)."})
    warmup_steps: float = field(
        default=4000, metadata={"help": "Warmup updates of the §5.3 schedule (4000); below 1, a fraction of the run."}
    )
    cooldown_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Decay the §5.3 rate linearly to 0 over this last fraction of the run's updates (0: the paper's "
            "schedule alone). The run's end is the budget's plan, followed when it re-plans."
        },
    )
    logging_steps: float = field(default=50, metadata={"help": "Log every N updates."})
    save_steps: float = field(default=1000, metadata={"help": "Save a checkpoint every N updates."})
    predict_with_generate: bool = field(default=True, metadata={"help": "Evaluate BLEU with generate()."})
    generation_num_beams: int | None = field(default=4, metadata={"help": "Beams for evaluation (§6.1: 4)."})
    dataloader_num_workers: int = field(default=0, metadata={"help": "Data loading workers."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Sentences per evaluation batch."})
    ddp_find_unused_parameters: bool | None = field(
        default=False, metadata={"help": "Every parameter gets a gradient; DDP need not search for unused ones."}
    )
    include_num_input_tokens_seen: str = field(  # a str on the command line (transformers' str | bool reads bools)
        default="non_padding",
        metadata={
            "help": "Count the source tokens trained on: non_padding (for the progress line's tokens/s), all or no.",
            "choices": ["non_padding", "all", "no"],
        },
    )

    def without_secrets(self) -> TransformerTrainingArguments:
        """A copy of these arguments without the value of any secret field (`hub_token`). The Trainer pickles its
        arguments into every checkpoint (`training_args.bin`), which people copy, share and upload with the Hub's own
        tools: no token goes with them. The run needs none there: it uploads nothing (`push_to_hub` is refused), and
        what it downloads reads the token of HF_TOKEN or `hf auth login`, as huggingface_hub does."""
        kept = copy.copy(self)
        for name in (item.name for item in dataclasses.fields(self)):
            if is_secret_flag(name):
                setattr(kept, name, None)
        return kept
