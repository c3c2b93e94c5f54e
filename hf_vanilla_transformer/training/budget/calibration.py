"""Measuring, before training, what a run will cost on this machine: the time of an update (forward, backward, Adam)
for each precision, attention implementation, compilation and batch size the recipe leaves open, as values
(`Timing`). The calibration measures and hands its times back; which candidate is best, and in which stages they are
measured, is the measuring step's (`measuring.measure_update`), as a checkpoint's time is.

The clock is read the way the Trainer pays:

1. before every clock read the device's queued work is waited for (`device.synchronizer`): CUDA runs kernels
   asynchronously, and a clock around unsynchronised work reads the time it took to queue them;
2. each candidate first runs an update on a batch of a shape no sampled batch has (first allocations, library
   handles), untimed;
3. each candidate is timed on `SAMPLE_BATCHES` of the run's real batches, spread over their sizes, of shapes of its
   own (a shape one candidate met is warm for the next: cuDNN plans and oneDNN primitives are the process's): each
   batch once as a new shape (cold), then, after the others (as the Trainer meets a shape again: not right after
   its first), once more (warm). An update of a known shape takes the mean of the warm ones (`Timing.steady`); a
   new shape adds the median of the differences (`per_shape`), and what the first updates cost beyond that is paid
   once (`once`: a compilation's first graphs);
4. a candidate that fails (out of memory, a kernel the GPU lacks) has its reason (`Timing.failure`), no time.

`fitting.py` counts the shapes a run meets from its own batches, so the figures predict the Trainer's time. Every
measurement runs on copies of the model, which is left untouched where it is, as is the global random state: the run
itself is exactly the one `--max_steps N` would give with the same N.
"""

from __future__ import annotations

import copy
import functools
import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from ...utils.device import cuda_kernels, forward_context, synchronizer


# A compiled training step is measured only where the run has this many minutes of training or more (or a given
# length): compiling the run's batch shapes costs minutes on a GPU, and the CPU's was measured slower than eager
# (docs/speed.md).
COMPILE_AFTER_MINUTES = 60
COMPILE_AFTER_UPDATES = 10_000  # (a run of a given length)
SAMPLE_BATCHES = 6  # real batches timed per candidate, each twice


@dataclass(frozen=True)
class Timing:
    """Seconds of an update: of a batch shape met before (`steady`), the extra of each new shape (`per_shape`), and
    what the first updates cost once beyond that (`once`); a candidate that could not run has a `failure` (and no
    finite time)."""

    steady: float
    per_shape: float = 0.0
    once: float = 0.0
    failure: str | None = None


Candidate = tuple[str, str | None, bool]  # (precision, attention implementation, compiled)


def candidate_key(precision: str, attention: str | None, compiled: bool = False) -> str:
    return f"{precision}/{attention or 'default'}" + ("/compiled" if compiled else "")


@dataclass
class Measurement:
    """What was measured for one model: the precision, attention and compilation the measuring step chose from the
    calibration's times (`measuring.measure_update`), the timing of a batch at each batch size (max_tokens), every
    update time measured ("fp32/sdpa@2048" -> steady seconds), and the reasons in words."""

    precision: str
    attention: str | None
    compiled: bool = False
    per_size: dict[int, Timing] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    @property
    def fixed(self) -> Candidate:
        return (self.precision, self.attention, self.compiled)


@dataclass(frozen=True)
class UpdateChoices:
    """What an update may be run with (one of each where the recipe fixed it: the calibration times them, the
    measuring step chooses), and which of them the recipe left to measure (`precision_open`, `compile_open`:
    "auto")."""

    precisions: tuple[str, ...]
    attentions: tuple[str | None, ...]
    compiles: tuple[bool, ...]
    precision_open: bool = False
    compile_open: bool = False


@dataclass(frozen=True)
class Calibration:
    """How a run's updates are measured on its device: the `choices` open, `sample_batches(max_tokens, count,
    taken)` (that many collated batches of that size, of shapes not in the set `taken`, to which it adds them), the
    optimizer the Trainer will build (`trainer_optimizer`) and the compile mode. `measure_stage` measures one
    stage's candidates (the measuring step's chosen one at more batch sizes is a stage of one)."""

    choices: UpdateChoices
    device: torch.device
    sample_batches: Callable[[int, int, set], list[dict]]
    optimizer: Callable
    compile_mode: str | None = None
    check: Callable[[], None] | None = None  # before each timed update: raises where the budget is spent

    def batches(self, size: int, count: int, taken: set) -> list[dict]:
        """`count` real batches of `size` on the device, of shapes not in `taken`."""
        return [{k: v.to(self.device) for k, v in batch.items()} for batch in self.sample_batches(size, count, taken)]

    def measure_stage(
        self, model: torch.nn.Module, size: int, candidates: list[Candidate], taken: set
    ) -> dict[str, Timing]:
        """One stage's measurements: each of `candidates` timed on copies of `model` on real batches of `size`, of
        shapes of its own not in `taken` (to which they are added); a candidate that could not run has a `failure`.
        Which is best is the caller's to say (`measuring.measure_update` ranks them)."""
        batches = self.batches(size, SAMPLE_BATCHES * len(candidates), taken)
        timings = measure_updates(
            model, batches, candidates, self.optimizer, self.device, compile_mode=self.compile_mode, shared=False,
            check=self.check,
        )  # fmt: skip
        if any(compiled for _, _, compiled in candidates):
            # The copies' graphs go after each stage: the next stage's compiled copies, like the Trainer's, compile
            # from scratch (their `once` counts it) and within dynamo's limits.
            torch._dynamo.reset()
        return timings


def measure_updates(
    model: torch.nn.Module,
    batches: Iterable[dict],
    candidates: list[Candidate],
    optimizer: Callable | None = None,
    device: torch.device | str | None = None,
    rounds: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    synchronize: Callable[[], None] | None = None,
    compile_mode: str | None = None,
    shared: bool = True,
    check: Callable[[], None] | None = None,
) -> dict[str, Timing]:
    """The `Timing` of an update (forward, backward, optimizer step) for each (precision, attention, compiled)
    candidate, measured on copies of `model` on `device` (default: the model's), which is left untouched where it
    is, as is the global random state (module docstring). With `shared` every candidate is timed on all `batches`,
    else candidate j on `batches[j::len(candidates)]` (shapes of its own). `optimizer(parameters)` builds the
    Trainer's optimizer (`trainer_optimizer`; default: fused AdamW). On a CPU the copies take turns over `rounds`
    rounds (a change of the machine's load falls on all alike); on a GPU they run one after another, one copy in
    memory at a time. The timing reads `clock` and `synchronize` (default: the device's); `check()`, called before
    each timed update, may end the measuring with a BudgetError (the budget's clock: `BudgetClock.check_measuring`)."""
    batches = list(batches)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    timer = _Timer(clock, synchronize or synchronizer(device), device, check)
    samples = {
        candidate_key(*c): batches if shared else batches[j :: len(candidates)] for j, c in enumerate(candidates)
    }
    prepare = functools.partial(
        _prepared, model, device, optimizer or trainer_optimizer(None), compile_mode, timer, batches[0]
    )
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        if device.type == "cpu":
            _in_turns([copy_ for copy_ in map(prepare, candidates) if copy_ is not None], samples, rounds, timer)
        else:
            for candidate in candidates:
                copy_ = prepare(candidate)
                if copy_ is not None:
                    timer.time(copy_, samples[copy_.key])
                del copy_
                torch.cuda.empty_cache()
    return {key: timer.timing(key) for key in samples}


def _in_turns(copies: list[_Copy], samples: dict[str, list[dict]], rounds: int, timer: _Timer) -> None:
    """The copies timed in turns over `rounds` rounds, each on its share of its own `samples` each round."""
    for turn in range(rounds):
        for copy_ in copies:
            per_round = math.ceil(len(samples[copy_.key]) / rounds)
            timer.time(copy_, samples[copy_.key][turn * per_round : (turn + 1) * per_round])


def _prepared(model, device, make_optimizer, compile_mode, timer: _Timer, batch: dict, candidate: Candidate):
    """The copy of `model` for `candidate`, warmed up on a shape no sampled batch has (`batch` cut); None, its failure
    kept by `timer`, where it cannot run (out of memory, a kernel missing, ...)."""
    try:
        copy_ = _Copy(model, candidate, device, make_optimizer, compile_mode)
        copy_.update(_unsampled_shape(batch))
        return copy_
    except (RuntimeError, ValueError, ImportError) as error:
        timer.fail(candidate_key(*candidate), error)
        return None


class _Timer:
    """Times updates as the module docstring says, keeping each candidate's cold and warm seconds, or its failure."""

    def __init__(self, clock, synchronize: Callable[[], None], device: torch.device, check=None):
        self.clock, self.synchronize, self.device, self.check = clock, synchronize, device, check
        self.colds: dict[str, list[float]] = {}
        self.warms: dict[str, list[float]] = {}
        self.failures: dict[str, str] = {}

    def seconds(self, copy_: _Copy, batch: dict) -> float:
        self.synchronize()  # every clock read waits for the device's queued work
        began = self.clock()
        copy_.update(batch)
        self.synchronize()
        return self.clock() - began

    def time(self, copy_: _Copy, chunk: list[dict]) -> None:
        """Each batch of `chunk` once as a new shape, then once more in reverse order (not right after its first)."""
        if copy_.key in self.failures or not chunk:
            return
        seconds = []
        for batch in [*chunk, *reversed(chunk)]:
            if self.check is not None:
                self.check()  # outside the try: a spent budget is no candidate's failure
            try:
                seconds.append(self.seconds(copy_, batch))
            except (RuntimeError, ValueError) as error:
                self.fail(copy_.key, error)
                return
        self.colds.setdefault(copy_.key, []).extend(seconds[: len(chunk)])
        self.warms.setdefault(copy_.key, []).extend(seconds[len(chunk) :][::-1])

    def fail(self, key: str, error: Exception) -> None:
        """Leave candidate `key` out: the first line of `error` (after running out of memory, the memory freed)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        self.failures[key] = "out of memory" if "out of memory" in text.lower() else text[:200]

    def timing(self, key: str) -> Timing:
        colds, warms = self.colds.get(key, []), self.warms.get(key, [])
        if key in self.failures or not warms:
            return Timing(math.inf, failure=self.failures.get(key, "no batch timed"))
        extras = [max(0.0, cold - warm) for cold, warm in zip(colds, warms, strict=True)]
        per_shape = statistics.median(extras)
        return Timing(statistics.fmean(warms), per_shape, max(0.0, sum(extras) - per_shape * len(extras)))


def _unsampled_shape(batch: dict) -> dict:
    """A batch of one row of `batch`, one token shorter where it can be: a shape no sampled batch has, to warm up
    on."""
    return {
        key: value[:1, : max(1, value.shape[1] - 1)] if value.dim() > 1 else value[:1] for key, value in batch.items()
    }


class _Copy:
    """A copy of the model on `device` for one candidate, with its own optimizer (and loss scale for fp16)."""

    def __init__(self, model, candidate: Candidate, device: torch.device, make_optimizer, compile_mode):
        self.precision, attention, compiled = candidate
        self.key = candidate_key(*candidate)
        self.device = device
        self.model = copy.deepcopy(model).to(device).train()
        if attention:
            self.model.set_attn_implementation(attention)
        self.optimizer = make_optimizer(self.model.parameters())
        self.forward = torch.compile(self.model, mode=compile_mode) if compiled else self.model
        self.scaler = torch.amp.GradScaler(device.type) if self.precision == "fp16" else None

    def update(self, batch: dict) -> None:
        with cuda_kernels(self.device, self.precision == "tf32"):
            with forward_context(self.device, self.precision):
                loss = self.forward(**batch).loss
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


def trainer_optimizer(args) -> Callable:
    """`parameters -> optimizer` as `Trainer` builds it for `args` (None: transformers' default optimizer, fused
    AdamW, with the paper's betas and epsilon): the calibration's update is the Trainer's update. The plain
    `torch.optim.Adam` steps parameter by parameter on a CPU, a cost the Trainer does not pay."""
    if args is None:  # (a new TrainingArguments would reset the accelerate state of a Trainer that exists)
        return lambda parameters: torch.optim.AdamW(parameters, lr=1e-5, betas=(0.9, 0.98), eps=1e-9, fused=True)
    from transformers import Trainer

    optimizer_class, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    return lambda parameters: optimizer_class(parameters, **kwargs)
