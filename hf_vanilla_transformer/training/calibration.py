"""Measuring, before training, what a run will cost on this machine: the time of an update (forward, backward, Adam)
for each precision, attention implementation and batch size the recipe leaves open, and the time of a checkpoint.

Every measurement runs on copies of the model, which is left untouched, as is the global random state: the run
itself is exactly the one `--max_steps N` would give with the same N. `planning.py` turns the figures into a plan.
"""

from __future__ import annotations

import copy
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from ..utils.machine import cpu_has_fast_bf16


@dataclass
class Measurement:
    """What calibration found for one model: the fastest precision and attention, the seconds of a batch at each
    batch size (max_tokens), every figure measured ("fp32/sdpa@2048" -> seconds) and the reasons in words."""

    precision: str
    attention: str | None
    per_size: dict[int, float] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)


def open_choices(recipe, args) -> tuple[list[str], list[str | None]]:
    """The precisions and attention implementations to measure (one each where the recipe fixed them)."""
    if recipe.precision == "auto":
        on_cpu = args.use_cpu or not torch.cuda.is_available()
        precisions = ["fp32", "bf16"] if (cpu_has_fast_bf16() or not on_cpu) else ["fp32"]
    else:
        precisions = [recipe.precision or ("bf16" if args.bf16 else "fp32")]
    attentions = ["eager", "sdpa"] if recipe.attn_implementation == "auto" else [recipe.attn_implementation]
    return precisions, attentions


def measure_choices(
    recipe,
    args,
    model: torch.nn.Module,
    sample_batches: Callable[[int], list[dict]],
    sizes: list[int],
    measure_all: bool,
    fixed: tuple[str, str | None] | None = None,
) -> Measurement:
    """Every precision and attention the recipe leaves open (the pair `fixed` where given) measured on real batches
    of the largest size `sizes[0]` (`sample_batches(max_tokens)`, on copies of `model`), then the fastest at the other
    sizes; nothing is measured where nothing is open and no budget asks for a time (`measure_all` False)."""
    precisions, attentions = ([fixed[0]], [fixed[1]]) if fixed else open_choices(recipe, args)
    if not measure_all and len(precisions) * len(attentions) == 1:
        return Measurement(precisions[0], attentions[0])
    device = torch.device("cuda") if torch.cuda.is_available() and not args.use_cpu else torch.device("cpu")
    model = model.to(device)

    def measure(max_tokens: int, pairs: list[tuple[str, str | None]]) -> dict[str, float]:
        batches = [{k: v.to(device) for k, v in batch.items()} for batch in sample_batches(max_tokens)]
        return measure_updates(model, batches, pairs, optimizer=trainer_optimizer(args))

    pairs = [(p, a) for p in precisions for a in attentions]
    first = measure(sizes[0], pairs)
    (precision, attention), fastest = min(((c, first[_key(*c)]) for c in pairs), key=lambda item: item[1])
    key = _key(precision, attention)
    measurement = Measurement(precision, attention, per_size={sizes[0]: fastest})
    measurement.reasons = _choice_reasons(recipe, precisions, attentions, first, precision, attention)
    for size in sizes[1:]:
        measurement.per_size[size] = measure(size, [(precision, attention)])[key]
    measurement.measured = {f"{name}@{sizes[0]}": value for name, value in first.items()}
    measurement.measured.update({f"{key}@{size}": measurement.per_size[size] for size in sizes[1:]})
    return measurement


def _key(precision: str, attention: str | None) -> str:
    return f"{precision}/{attention or 'default'}"


def calibration_batches(batches: list[list[int]], count: int) -> list[list[int]]:
    """`count` batches spread evenly over the sizes of `batches` (sorted by their number of pairs times their
    order): a sample whose mean update time is close to the epoch's, whatever the length distribution."""
    if len(batches) <= count:
        return list(batches)
    ranked = sorted(batches, key=len)
    return [ranked[round(i * (len(ranked) - 1) / (count - 1))] for i in range(count)] if count > 1 else ranked[:1]


def measure_updates(
    model: torch.nn.Module,
    batches: Iterable[dict],
    candidates: list[tuple[str, str | None]],
    optimizer: Callable | None = None,
    warmup: int = 2,
    rounds: int = 2,
) -> dict[str, float]:
    """Mean seconds of an update (forward, backward, optimizer step) for each (precision, attention) candidate,
    measured on copies of `model`, which is left untouched, as is the global random state. `optimizer(parameters)`
    builds the optimizer the Trainer will use (`trainer_optimizer`; default: its default, fused AdamW). The
    candidates take turns over `rounds` rounds so that a change in the machine's load falls on all of them alike."""
    batches = list(batches)
    optimizer = optimizer or trainer_optimizer(None)
    copies = {}
    for precision, attention in candidates:
        clone = copy.deepcopy(model).train()
        if attention:
            clone.set_attn_implementation(attention)
        copies[(precision, attention)] = (clone, optimizer(clone.parameters()))
    times: dict[tuple[str, str | None], list[float]] = {key: [] for key in copies}
    with torch.random.fork_rng(devices=[]):
        for key, (clone, optimizer) in copies.items():  # the first updates of each copy allocate; not timed
            for batch in batches[:warmup]:
                _update(clone, optimizer, batch, key[0])
        per_round = max(1, math.ceil(len(batches) / rounds))
        for start in range(0, len(batches), per_round):
            for key, (clone, optimizer) in copies.items():
                for batch in batches[start : start + per_round]:
                    began = time.perf_counter()
                    _update(clone, optimizer, batch, key[0])
                    times[key].append(time.perf_counter() - began)
    return {
        _key(precision, attention): statistics.fmean(times[(precision, attention)])
        for precision, attention in candidates
    }


def _update(model, optimizer, batch: dict, precision: str) -> None:
    device_type = next(model.parameters()).device.type
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def trainer_optimizer(args) -> Callable:
    """`parameters -> optimizer` as `Trainer` builds it for `args` (None: transformers' default optimizer, fused
    AdamW, with the paper's betas and epsilon): the calibration's update is the Trainer's update. The plain
    `torch.optim.Adam` steps parameter by parameter on a CPU, a cost the Trainer does not pay."""
    if args is None:  # (a new TrainingArguments would reset the accelerate state of a Trainer that exists)
        return lambda parameters: torch.optim.AdamW(parameters, lr=1e-5, betas=(0.9, 0.98), eps=1e-9, fused=True)
    from transformers import Trainer

    optimizer_class, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    return lambda parameters: optimizer_class(parameters, **kwargs)


def measure_checkpoint_seconds(model: torch.nn.Module) -> float:
    """Seconds to write the model and an Adam state of its size, as a checkpoint does."""
    state = {name: (torch.zeros_like(p), torch.zeros_like(p)) for name, p in model.named_parameters()}
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        model.save_pretrained(folder)
        torch.save(state, os.path.join(folder, "optimizer.pt"))
        return time.perf_counter() - began


def _choice_reasons(recipe, precisions, attentions, measured, precision, attention) -> list[str]:
    def seconds(p, a):
        return measured[_key(p, a)]

    reasons = []
    if recipe.precision == "auto" and len(precisions) == 1:
        reasons.append("fp32: no bf16 matrix units in this CPU (AMX or AVX512-BF16)")
    elif len(precisions) > 1:
        other = next(p for p in precisions if p != precision)
        reasons.append(
            f"{precision}: {seconds(precision, attention):.2f} s per update against "
            f"{seconds(other, attention):.2f} s in {other}"
        )
    else:
        reasons.append(f"{precision} as given")
    if len(attentions) > 1:
        other = next(a for a in attentions if a != attention)
        reasons.append(
            f"{attention} attention: {seconds(precision, attention):.2f} s per update against "
            f"{seconds(precision, other):.2f} s with {other}"
        )
    return reasons
