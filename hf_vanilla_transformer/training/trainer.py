"""The Trainer of the paper's recipe: the §5.3 learning-rate schedule (`budget/schedule.py`'s), token-budget batches
(§5.1), evaluation batches sorted by length, and checkpoints marked complete. On a GPU it keeps the device busy:
batches prepared by worker processes into pinned memory, no host read of a tensor value in an update (the model's
checks and padding skip step aside, the tokens seen are counted on the device and read at each log), TF32 where the
plan chose it."""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer
from transformers.trainer_utils import rotate_checkpoints
from transformers.utils import logging as hf_logging

from ..data.batching import TokenBudgetBatchSampler, evaluation_batches
from ..model.inputs_vanilla_transformer import without_host_reads
from ..utils.device import cuda_kernels
from ..utils.faults import moment
from ..utils.files import disk_full, folder_bytes, is_disk_full
from ..utils.kernels import without_cudnn_attention
from ..utils.machine import release_mapped_pages
from .budget import noam_schedule
from .checkpoints import checkpoint_folders, mark_complete
from .collapse import source_dependence


logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _without_nested_bars():
    """No transformers progress bars (such as save_pretrained's "Writing model shards") inside the training bar when
    the output is a log file: placed one line below it, they move the cursor up and leave "\x1b[A" behind."""
    if sys.stderr.isatty() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


class TransformerTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with token-budget batches (§5.1) and the §5.3 learning-rate schedule.

    `batch_sampler` (a `TokenBudgetBatchSampler`) replaces the fixed batch size for training; evaluation batches
    are sorted by length too, so that beam search wastes little on padding. With `source_check`, each validation
    also measures how much the predictions depend on their source (`collapse.source_dependence`: metrics
    `eval_source_loss`, `eval_loss_shuffled_sources`, `eval_source_gain`).
    """

    def __init__(
        self, *args, batch_sampler: TokenBudgetBatchSampler | None = None, source_check: bool = False, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self.batch_sampler = batch_sampler
        self.source_check = source_check
        self._tokens_on_device: torch.Tensor | None = None  # (source, target) tokens since the last read
        self.target_tokens_seen = 0  # in this session (not kept in checkpoints)
        self._counted_parameters: tuple[int, int] | None = None  # (id of the model, its non-embedding parameters)

    def train(self, *args, **kwargs):
        with cuda_kernels(self.args.device, bool(self.args.tf32)):
            return super().train(*args, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.args.device.type != "cuda":
            return super().training_step(model, inputs, num_items_in_batch)
        with without_host_reads():  # each read would wait for the queued kernels
            return super().training_step(model, inputs, num_items_in_batch)

    def _get_grad_norm(self, model, grad_norm=None):
        """The gradient norm of an update whose log shows it, else None. Without clipping (the paper's
        `max_grad_norm` 0) `Trainer` would compute it at every update only to drop it between logs: a pass over
        every gradient that scales each by 1 (about 3% of a 1,024-token update on a 2-core CPU; on a GPU a
        reduction read back at each log)."""
        if grad_norm is None and not self._logs_next_update():
            return None
        return super()._get_grad_norm(model, grad_norm)

    def _logs_next_update(self) -> bool:
        """Whether the update about to be counted may be logged (`DefaultFlowCallback`'s rule): with
        `logging_strategy` "epoch" any update may be its epoch's last, so every one is."""
        step, args = self.state.global_step + 1, self.args
        if step == 1 and args.logging_first_step:
            return True
        if args.logging_strategy == "steps":
            return step % self.state.logging_steps == 0  # (never 0: TrainingArguments refuses it)
        return args.logging_strategy != "no"

    def floating_point_ops(self, inputs) -> int:
        """`Trainer`'s count (6 x the input tokens x the parameters outside the embeddings), with the parameters
        counted once per model: `Trainer` counts them at every update, a walk over every module and parameter (about
        1 ms of a 200 ms update on a 2-core CPU) for a number that does not change while the model trains."""
        main_input = getattr(self.model, "main_input_name", "input_ids")
        if main_input not in inputs or not hasattr(self.model, "num_parameters"):
            return super().floating_point_ops(inputs)
        if self._counted_parameters is None or self._counted_parameters[0] != id(self.model):
            self._counted_parameters = (id(self.model), self.model.num_parameters(exclude_embeddings=True))
        return 6 * inputs[main_input].numel() * self._counted_parameters[1]

    def _track_num_input_tokens(self, inputs):
        """The tokens seen: the Trainer's count of the source tokens, and the target tokens beside it (what the
        benchmark counts), summed over the processes and kept on the device until the next log, validation or
        checkpoint: the Trainer reads its count on the host at every update, which on a GPU waits for every queued
        kernel."""
        counting = self.args.include_num_input_tokens_seen
        if counting == "no" or not isinstance(inputs, Mapping) or not {"attention_mask", "labels"} <= set(inputs):
            return super()._track_num_input_tokens(inputs)
        mask, labels = inputs["attention_mask"], inputs["labels"]
        source = mask.sum() if counting == "non_padding" else torch.tensor(mask.numel(), device=mask.device)
        counts = torch.stack([source.to(torch.int64), (labels != -100).sum().to(torch.int64)])
        counts = self.accelerator.gather(counts).reshape(-1, 2).sum(0)
        self._tokens_on_device = counts if self._tokens_on_device is None else self._tokens_on_device + counts

    def _read_tokens_seen(self) -> None:
        if self._tokens_on_device is not None:
            source, target = self._tokens_on_device.tolist()
            self.state.num_input_tokens_seen += source
            self.target_tokens_seen += target
            self._tokens_on_device = None

    def log(self, logs, start_time=None):
        self._read_tokens_seen()
        return super().log(logs, start_time)

    def evaluate(self, *args, **kwargs):
        self._read_tokens_seen()  # the progress line's rates count tokens up to here
        with without_cudnn_attention(self.args.device):  # a new key length at every decoding step
            return super().evaluate(*args, **kwargs)

    def get_train_dataloader(self) -> DataLoader:
        if self.batch_sampler is None:
            return super().get_train_dataloader()
        dataset = self._remove_unused_columns(self.train_dataset, description="Training")
        workers = self.args.dataloader_num_workers
        loader = DataLoader(
            dataset,
            batch_sampler=self.batch_sampler,
            collate_fn=PageReleasingCollator(self.data_collator),
            num_workers=workers,
            pin_memory=self.args.dataloader_pin_memory and self.args.device.type == "cuda",
            persistent_workers=self.args.dataloader_persistent_workers and workers > 0,
            prefetch_factor=self.args.dataloader_prefetch_factor if workers > 0 else None,
        )
        # accelerate gives each process every num_processes-th batch; Trainer calls set_epoch on our sampler.
        return self.accelerator.prepare(loader)

    def get_eval_dataloader(self, eval_dataset=None) -> DataLoader:
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, str) or dataset is None or "input_ids" not in dataset.column_names:
            return super().get_eval_dataloader(eval_dataset)
        dataset = self._remove_unused_columns(dataset, description="Evaluation")
        lengths = [len(ids) for ids in dataset["input_ids"]]
        sampler = evaluation_batches(lengths, self.args.per_device_eval_batch_size)
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=self.data_collator)
        return self.accelerator.prepare(loader)

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None, **kwargs):
        self._prediction_seconds, self._decoding_steps = 0.0, [0, 0]
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, **kwargs)
        prefix = kwargs.get("metric_key_prefix", "eval")
        moment("validation")
        # The prediction steps' own time (decoding, and each batch's loss), apart from the metrics and the loop, and
        # the decoding steps they took against those of translations as long as the references (`decoding_steps`).
        output.metrics[f"{prefix}_prediction_seconds"] = self._prediction_seconds
        if self._decoding_steps[0]:
            output.metrics[f"{prefix}_decoding_steps"], output.metrics[f"{prefix}_reference_steps"] = (
                self._decoding_steps
            )
        if self.source_check and prefix == "eval":
            training = self.model.training
            self.model.eval()
            began = time.perf_counter()
            found = source_dependence(
                self.model,
                dataloader,
                self.autocast_smart_context_manager,
                lambda totals: self.accelerator.reduce(totals, "sum"),
            )
            self.model.train(training)
            if found is not None:
                output.metrics.update(
                    {f"{prefix}_{'source_loss' if name == 'loss' else name}": value for name, value in found.items()}
                )
                output.metrics[f"{prefix}_source_check_seconds"] = time.perf_counter() - began
        return output

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        # Seq2SeqTrainer fills the model's generation config with transformers' global defaults (max_length 20, ...)
        # in place; every checkpoint would then carry them. Evaluate on a copy and keep the model's own config.
        generation_config = copy.deepcopy(self.model.generation_config)
        began = time.perf_counter()
        try:
            result = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        finally:
            self.model.generation_config = generation_config
            self._prediction_seconds = getattr(self, "_prediction_seconds", 0.0) + time.perf_counter() - began
        if result[1] is not None and result[2] is not None:
            pad = self.model.config.pad_token_id
            taken, reference = decoding_steps(result[1], result[2], pad)
            counts = getattr(self, "_decoding_steps", [0, 0])
            self._decoding_steps = [counts[0] + taken, counts[1] + reference]
        return result

    def _save_checkpoint(self, model, trial) -> None:
        """`Trainer`'s checkpoint, then a `.complete` marker once every process has written its part, so that a
        checkpoint interrupted at any moment (SIGKILL included) is never mistaken for a complete one. A device that
        fills up while writing it is named (`DiskFullError`), the partial checkpoint removed: the last complete
        one stays, to resume from."""
        self._read_tokens_seen()  # the checkpoint's trainer state holds the count
        folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        # `Trainer` removes the checkpoints over `save_total_limit` before this one is marked complete: a kill in
        # between would leave none to resume from. They are removed here, once it is.
        limit, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            with _without_nested_bars():
                super()._save_checkpoint(model, trial)
        except Exception as error:
            if not is_disk_full(error, folder.parent):
                raise
            shutil.rmtree(folder, ignore_errors=True)
            raise disk_full(folder.parent, _checkpoint_bytes(folder.parent), f"checkpoint {folder.name}") from error
        finally:
            self.args.save_total_limit = limit
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            moment("checkpoint-marker")
            mark_complete(folder, self.state.global_step)
            rotate_checkpoints(
                str(folder.parent), save_total_limit=limit, best_model_checkpoint=self.state.best_model_checkpoint
            )
        self.accelerator.wait_for_everyone()

    def _save_optimizer_and_scheduler(self, output_dir):
        moment("checkpoint-weights", output_dir)  # the weights are written, the optimizer state not yet
        super()._save_optimizer_and_scheduler(output_dir)
        moment("checkpoint-optimizer")

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        if self.lr_scheduler is None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            self.lr_scheduler = noam_schedule(
                optimizer,
                int(self.args.warmup_steps),
                getattr(self.args, "cooldown_fraction", 0.0),  # plain Seq2SeqTrainingArguments: none
                lambda: self.state.max_steps or num_training_steps,
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler


class PageReleasingCollator:
    """The training batches' collator, which first unmaps from the process that reads the batches (the main one, or
    a data-loading worker) the pages of the memory-mapped training split it has read (`release_mapped_pages`):
    each row read maps a large folio of the file around it, so over a run the process would map the whole split
    (4.5 GB at 36M pairs) in its resident memory; so it maps the rows of the batch it reads. The pages stay in the
    page cache: the rows read the same. About a millisecond a batch."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, features):
        release_mapped_pages()
        return self.collate(features)


def decoding_steps(generated: torch.Tensor, labels: torch.Tensor, pad_token_id: int | None) -> tuple[int, int]:
    """(the decoding steps a batch's generate() took, those of translations as long as its references): the longest
    row of each, padding not counted (generate() pads the rows that ended, the Trainer pads both to the length
    limit). A batch decodes until its longest row ends: an untrained model runs each to its limit, a trained one
    about to its longest reference, and a validation's decoding time follows the steps."""
    real = labels.ne(-100) & (labels.ne(pad_token_id) if pad_token_id is not None else True)
    taken = generated.ne(pad_token_id) if pad_token_id is not None else torch.ones_like(generated, dtype=torch.bool)
    return int(taken.sum(-1).max()), int(real.sum(-1).max())


def _checkpoint_bytes(output_dir: Path) -> int | None:
    """What a checkpoint of this run takes, from its newest complete one (None before the first)."""
    folders = checkpoint_folders(output_dir)
    return folder_bytes(folders[-1]) if folders else None
