"""Batches by approximate length holding about N source and N target tokens (§5.1), computed from arrays.

The rule: order the training pairs by (source length, target length), pairs of equal lengths in a random order that
changes every epoch; cut that order greedily into batches whose padded source and padded target each stay within
`max_tokens` (a pair longer than that on its own makes a batch of one); serve the batches in a random order.

The sorted length sequence is the same every epoch (only pairs of equal lengths trade places), so the batch
boundaries are computed once, over runs of equal lengths rather than pair by pair. Each epoch is then a NumPy
permutation: the pairs ordered by a stable radix sort of their length group, the batches shuffled, and batches
yielded one at a time. Both are deterministic given (seed, epoch), so a resumed run sees the batches the interrupted
one would have seen next (`Trainer` skips the consumed ones). Under several processes `accelerate` hands each process
every `num_processes`-th batch.
"""

from __future__ import annotations

import copy
import errno
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from torch.utils.data import Sampler

from ..utils.files import disk_full, is_disk_full


KEY_CHUNK = 1 << 20  # lengths made into sort keys, pairs of an epoch's order sorted, at a time
# A split of this many pairs or more keeps its arrays of a pair each (its length groups, 2 bytes a pair; an epoch's
# order, 4) in file-backed maps of the scratch folder, where one is given: at 36M pairs they were 0.22 GB of every
# process's own memory, growing with the corpus.
SCRATCH_FROM = 1 << 22


class LengthSortedSampler(Sampler[int]):
    """Indices sorted by (source length, target length), equal lengths in a random order seeded by (seed, epoch)."""

    def __init__(
        self, source_lengths: Sequence[int], target_lengths: Sequence[int], seed: int = 0, shuffle: bool = True
    ):
        sources, targets = _integers(source_lengths), _integers(target_lengths)
        if sources.shape != targets.shape:
            raise ValueError(f"{len(sources)} source lengths but {len(targets)} target lengths.")
        pieces = range(0, len(sources), KEY_CHUNK)  # views: the keys are made a piece at a time
        self._group(
            [sources[i : i + KEY_CHUNK] for i in pieces], [targets[i : i + KEY_CHUNK] for i in pieces], seed, shuffle
        )

    @classmethod
    def of_chunks(
        cls,
        sources: list[np.ndarray],
        targets: list[np.ndarray],
        seed: int = 0,
        shuffle: bool = True,
        scratch: str | Path | None = None,
    ) -> LengthSortedSampler:
        """The sampler of the lengths `np.concatenate(sources)`, `np.concatenate(targets)`, read chunk by chunk (the
        length columns' record batches, memory-mapped): no copy of the lengths is made. With a `scratch` folder,
        the arrays of a pair each (the groups, an epoch's order) of a split of `SCRATCH_FROM` pairs or more are
        kept in file-backed maps there (`scratch_array`)."""
        if [len(chunk) for chunk in sources] != [len(chunk) for chunk in targets]:
            raise ValueError("The source and target length chunks differ in size.")
        sampler = cls.__new__(cls)
        sources, targets = [_integers(chunk) for chunk in sources], [_integers(chunk) for chunk in targets]
        sampler._group(sources, targets, seed, shuffle, scratch)
        return sampler

    def _group(
        self, sources: list[np.ndarray], targets: list[np.ndarray], seed: int, shuffle: bool, scratch=None
    ) -> None:
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.scratch = scratch
        # Only the groups are kept (16 bits a pair where they fit): 72 MB at 36M pairs, where the lengths and a
        # sorted order in int64 held 0.87 GB in every process.
        self.groups, self.group_sources, self.group_targets, self.group_sizes = length_groups(
            sources, targets, self.array
        )

    def array(self, length: int, dtype: type) -> np.ndarray:
        """An array of `length` for a pair each: in a file-backed map of the scratch folder for a large split, else
        in memory."""
        if self.scratch is not None and length >= SCRATCH_FROM:
            return scratch_array(length, dtype, self.scratch)
        return np.empty(length, dtype=dtype)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def rng(self) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch])

    def __iter__(self) -> Iterator[int]:
        return iter(self.order(self.rng()).tolist())

    def order(self, rng: np.random.Generator) -> np.ndarray:
        """The epoch's order: a random permutation, then stably sorted by length group (ties keep its order).

        The order is held for the whole epoch, 32 bits a pair where they suffice: the permutation is shuffled in
        place (the same draws, and the same permutation, as `rng.permutation`, without its 64-bit copy), then
        sorted by a stable counting sort over the group sizes a chunk at a time (what `np.argsort(..., kind=
        "stable")` gives, without its 64-bit indices); both arrays are `array`s (file-backed for a large split)."""
        if not self.shuffle:
            return np.argsort(self.groups, kind="stable")
        count, index_type = len(self.groups), np.uint32 if len(self.groups) < 2**32 else np.int64
        permutation = self.array(count, index_type)
        for start in range(0, count, KEY_CHUNK):
            permutation[start : start + KEY_CHUNK] = np.arange(start, min(count, start + KEY_CHUNK))
        rng.shuffle(permutation.view(np.ndarray))  # (a memmap would take NumPy's element-by-element path)
        order = self.array(count, index_type)
        cursor = np.concatenate([[0], np.cumsum(self.group_sizes)[:-1]])  # where each group's next pair goes
        for start in range(0, count, KEY_CHUNK):
            chunk = np.asarray(permutation[start : start + KEY_CHUNK])
            groups = self.groups[chunk]
            by_group = np.argsort(groups, kind="stable")
            ranked = groups[by_group]
            within = np.arange(len(ranked)) - np.searchsorted(ranked, ranked, side="left")  # rank in its group
            order[cursor[ranked] + within] = chunk[by_group]
            cursor += np.bincount(groups, minlength=len(cursor))
        return order

    def __len__(self) -> int:
        return len(self.groups)


def scratch_array(length: int, dtype: type, folder: str | Path) -> np.ndarray:
    """A zeroed array of `length` in a file-backed shared map of an unlinked temporary file in `folder` (on a disk,
    not a tmpfs: its pages are page cache the system writes back and takes back as it needs, not the process's own
    memory; the file's space is freed when the array is)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    size = length * np.dtype(dtype).itemsize
    with tempfile.TemporaryFile(dir=folder) as handle:
        try:  # the blocks taken now: a full disk is an error here, not a SIGBUS at a write through the map
            os.posix_fallocate(handle.fileno(), 0, size)
        except OSError as error:
            if is_disk_full(error, Path(folder)):
                raise disk_full(Path(folder), size, "the training pairs' length groups or epoch order") from error
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it: sparse, as before
                raise
            handle.truncate(size)
        return np.memmap(handle, dtype=dtype, mode="r+", shape=(length,))


def length_groups(sources: list[np.ndarray], targets: list[np.ndarray], allocate=np.empty) -> tuple[np.ndarray, ...]:
    """(each pair's length group, each group's source length, target length and size) for the pairs whose
    lengths are the chunks `sources` and `targets` end to end: a group is the rank of a pair's (source, target)
    lengths among the distinct ones in sorted order, in 16 bits where they fit (NumPy's stable sort of 16-bit
    integers is a radix sort). The keys are made a chunk at a time, 32-bit where they fit: building the groups holds
    the groups and one chunk's keys, not 64-bit copies of every length (1.2 GB at 36M pairs)."""
    width = max((int(chunk.max(initial=0)) for chunk in targets), default=0) + 1
    top = (max((int(chunk.max(initial=0)) for chunk in sources), default=0) + 1) * width  # every key is below
    key_type = np.int32 if top < 2**31 else np.int64

    def keys():
        for source, target in zip(sources, targets, strict=True):
            yield source.astype(key_type, copy=False) * width + target.astype(key_type, copy=False)

    if top <= 2**22:  # a table of every possible key (32 MB at most): linear time
        present = np.zeros(top, dtype=bool)
        for chunk in keys():
            present[chunk] = True
        distinct = np.flatnonzero(present)
        rank = (np.cumsum(present) - 1).astype(_group_type(len(distinct)))
        grouped = (rank[chunk] for chunk in keys())
    else:
        distinct = np.unique(np.concatenate([np.unique(chunk) for chunk in keys()]))
        rank_type = _group_type(len(distinct))
        grouped = (np.searchsorted(distinct, chunk).astype(rank_type) for chunk in keys())
    groups = allocate(sum(len(chunk) for chunk in sources), _group_type(len(distinct)))
    sizes, start = np.zeros(len(distinct), dtype=np.int64), 0
    for chunk in grouped:
        groups[start : start + len(chunk)] = chunk
        sizes += np.bincount(chunk, minlength=len(distinct))  # a chunk at a time: bincount widens to 64 bits
        start += len(chunk)
    return groups, distinct // width, distinct % width, sizes


def _group_type(count: int) -> type:
    return np.uint16 if count <= 2**16 else np.int32


def _integers(values: Sequence[int]) -> np.ndarray:
    """Lengths as an integer array, without a copy where they already are one (the columns' int32)."""
    array = np.asarray(values)
    return array if np.issubdtype(array.dtype, np.integer) else array.astype(np.int64)


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of pairs of similar length with padded source and padded target tokens each at most `max_tokens`.

    A pair longer than `max_tokens` on its own makes a batch of one. `batch_size` is None (batches vary in size),
    which is what `accelerate` and `Trainer` expect of a dynamic batch sampler.
    """

    batch_size = None
    drop_last = False

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        max_sentences: int | None = None,
    ):
        self._cut(
            LengthSortedSampler(source_lengths, target_lengths, seed=seed, shuffle=shuffle), max_tokens, max_sentences
        )

    @classmethod
    def over(
        cls, sampler: LengthSortedSampler, max_tokens: int, max_sentences: int | None = None
    ) -> TokenBudgetBatchSampler:
        """Batches of another size over the same pairs: `sampler`'s length groups shared (not copied), its seed,
        an epoch of their own (starting at `sampler`'s; `set_epoch` on one leaves the others). The batches are those
        of `TokenBudgetBatchSampler(lengths..., max_tokens)`."""
        batches = cls.__new__(cls)
        batches._cut(copy.copy(sampler), max_tokens, max_sentences)
        return batches

    def _cut(self, sampler: LengthSortedSampler, max_tokens: int, max_sentences: int | None) -> None:
        """Where the batches start and end in the length-sorted order, and their padded tokens."""
        if len(sampler) == 0:
            raise ValueError("Cannot batch an empty dataset.")
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} is invalid; expected a positive number of tokens per batch.")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"max_sentences={max_sentences} is invalid; expected None or a positive integer.")
        self.sampler = sampler
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        groups = self.sampler
        self.starts = batch_starts(
            groups.group_sizes, groups.group_sources, groups.group_targets, max_tokens, max_sentences
        )
        self.ends = np.append(self.starts[1:], len(groups))
        # Padded tokens of each batch: its size times its longest source (its last group's) plus its longest target
        # (the longest of the groups it spans: those up to the next batch's first, and its last).
        group_ends = np.cumsum(groups.group_sizes)
        first, last = (np.searchsorted(group_ends, at, side="right") for at in (self.starts, self.ends - 1))
        longest_target = np.maximum(np.maximum.reduceat(groups.group_targets, first), groups.group_targets[last])
        self._longest = (groups.group_sources[last], longest_target)  # each batch's longest source and target
        self._padded = (self.ends - self.starts) * (groups.group_sources[last] + longest_target)
        self._shape_counts: dict[int, np.ndarray] = {}

    @property
    def shuffle(self) -> bool:
        return self.sampler.shuffle

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def batches(self) -> list[list[int]]:
        """This epoch's batches, in the order they are served."""
        return list(self)

    def __iter__(self) -> Iterator[list[int]]:
        rng = self.sampler.rng()
        order = self.sampler.order(rng)
        served = rng.permutation(len(self.starts)) if self.shuffle else range(len(self.starts))
        for batch in served:
            yield order[self.starts[batch] : self.ends[batch]].tolist()

    def __len__(self) -> int:
        return len(self.starts)

    def shape_sample(self, count: int, multiple: int = 1, taken: set | None = None) -> list[list[int]]:
        """`count` batches of epoch 0 that stand for the batches a run is served: the epoch's batches ranked by their
        number of pairs (ties in the order served), taken at the midpoints of `count` equal shares of them (a sample
        of batches, not of shapes: the rare extremes, a batch of hundreds of one-word pairs, would weigh as much as
        the common ones, and timed cheaper than the run's updates), each the nearest in the ranking of a padded
        shape (pairs, longest source, longest target, the lengths rounded up to `multiple`) that no other of them
        has and that `taken` does not hold; their shapes are added to `taken`. Fewer where the epoch has fewer such
        shapes. The calibration times each candidate on shapes of its own: a shape one candidate met is warm for the
        next (cuDNN plans, oneDNN primitives, the allocator's blocks)."""
        taken = set() if taken is None else taken
        rng = np.random.default_rng([self.sampler.seed, 0])
        order = self.sampler.order(rng)
        served = rng.permutation(len(self.starts)) if self.shuffle else np.arange(len(self.starts))
        pairs = self.ends - self.starts
        ranked = served[np.argsort(pairs[served], kind="stable")]
        shapes = [tuple(shape) for shape in self._padded_shapes(multiple)[ranked].tolist()]
        chosen = []
        for share in range(count):
            found = _nearest_free(shapes, int((share + 0.5) * len(shapes) / count), taken)
            if found is None:
                break
            taken.add(shapes[found])
            chosen.append(int(ranked[found]))
        return [order[self.starts[batch] : self.ends[batch]].tolist() for batch in chosen]

    def shape_counts(self, multiple: int = 1) -> np.ndarray:
        """How many of the epoch's batches have each distinct padded shape (pairs, longest source, longest target),
        the lengths rounded up to `multiple` as the collator pads them (`pad_to_multiple_of`)."""
        if multiple not in self._shape_counts:
            self._shape_counts[multiple] = np.unique(self._padded_shapes(multiple), axis=0, return_counts=True)[1]
        return self._shape_counts[multiple]

    def _padded_shapes(self, multiple: int) -> np.ndarray:
        """Each of the epoch's batches' padded shape (pairs, longest source, longest target), (batches, 3), the
        lengths rounded up to `multiple` as the collator pads them."""
        sources, targets = (-(-lengths // multiple) * multiple for lengths in self._longest)
        return np.stack([self.ends - self.starts, sources, targets], axis=1)

    def shapes_met(self, batches: int, multiple: int = 1) -> float:
        """The expected number of distinct batch shapes among the first `batches` batches served (every shape from
        the first whole epoch on): a shape held by c of the epoch's M batches is missed by n of them, drawn in
        random order, with probability about (1 - n / M)^c."""
        counts = self.shape_counts(multiple)
        total = int(counts.sum())
        if batches >= total:
            return float(len(counts))
        return float(np.sum(1.0 - (1.0 - max(0, batches) / total) ** counts))

    def tokens_per_batch(self) -> float:
        """Mean padded source + target tokens per batch."""
        return float(self._padded.sum() / len(self.starts))


def _nearest_free(shapes: list[tuple], at: int, taken: set) -> int | None:
    """The index nearest `at` (after it first) whose shape `taken` does not hold, or None."""
    for distance in range(len(shapes)):
        for index in (at + distance, at - distance - 1):
            if 0 <= index < len(shapes) and shapes[index] not in taken:
                return index
    return None


def batch_starts(
    run_sizes: np.ndarray, run_sources: np.ndarray, run_targets: np.ndarray, max_tokens: int, max_sentences=None
) -> np.ndarray:
    """Where each batch starts in the length-sorted sequence, given its runs of equal (source, target) lengths in
    sorted order (sources non-decreasing, ties by target): their sizes and lengths.

    Greedy, as pair by pair: a pair joins the open batch while (size + 1) x max(longest source, longest target)
    stays within `max_tokens` (and size + 1 within `max_sentences`), else it opens the next one. The loop runs over
    the runs: a run first fills the open batch, then opens as many batches of equal size as it needs at once."""
    cap = max_sentences or math.inf
    starts, size, longest_target, start = [], 0, 0, 0
    for count, source, target in zip(run_sizes.tolist(), run_sources.tolist(), run_targets.tolist(), strict=True):
        taken = 0
        if size:  # 1. the open batch takes what fits of this run
            taken = max(0, min(min(max_tokens // max(1, source, longest_target, target), cap) - size, count))
            size, longest_target = size + taken, max(longest_target, target)
        if taken < count:  # 2. the rest opens batches of `per` pairs each (a pair too long alone: one)
            per = max(1, min(max_tokens // max(1, source, target), cap))
            rest = count - taken
            opened = -(-rest // per)
            starts.append(start + taken + per * np.arange(opened))
            size, longest_target = rest - per * (opened - 1), target
        start += count
    return np.concatenate(starts).astype(np.int64)


def accumulation_steps(tokens_per_update: int | None, max_tokens: int, num_processes: int = 1) -> int:
    """Gradient accumulation so that one update holds about `tokens_per_update` source (and as many target)
    tokens across all processes, with batches of at most `max_tokens` each."""
    if tokens_per_update is None:
        return 1
    if tokens_per_update < 1:
        raise ValueError(f"tokens_per_update={tokens_per_update} is invalid; expected a positive number.")
    return max(1, math.ceil(tokens_per_update / (max_tokens * num_processes)))


def inference_batches(
    lengths: Sequence[int], max_tokens: int | None = None, max_sentences: int | None = None
) -> list[list[int]]:
    """The indices of sentences of `lengths` tokens in batches to translate: longest first (little padding), each
    batch of at most `max_sentences` sentences whose padded tokens (its longest times its count) stay within
    `max_tokens` (a longer sentence alone)."""
    batches, current, longest = [], [], 0
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        longest = max(longest, lengths[index]) if current else lengths[index]
        full = (max_tokens is not None and longest * (len(current) + 1) > max_tokens) or (
            max_sentences is not None and len(current) >= max_sentences
        )
        if current and full:
            batches.append(current)
            current, longest = [], lengths[index]
        current.append(index)
    return [*batches, current] if current else batches


def evaluation_batches(lengths: Sequence[int], sentences_per_batch: int) -> TokenBudgetBatchSampler:
    """The batches the Trainer's validation runs in (`TransformerTrainer.get_eval_dataloader`), for sentences
    of `lengths` tokens: `sentences_per_batch` sentences of the mean length per batch, padded tokens counted, pairs
    of similar length together, in a fixed order."""
    budget = sentences_per_batch * max(1, int(sum(lengths) / max(1, len(lengths))))
    return TokenBudgetBatchSampler(lengths, lengths, max_tokens=budget, shuffle=False)


class BatchSamplers:
    """One token-budget batch sampler per batch size over a training split's lengths, built once and shared by the
    planner (calibration, epoch sizes) and the Trainer. Every size shares one array of the pairs' length groups (2
    bytes a pair), made from the chunks of the lengths (`data.pipeline.length_chunks`: the memory-mapped length
    columns, a record batch at a time; the lengths are never copied)."""

    def __init__(self, chunks: tuple[list[np.ndarray], list[np.ndarray]], seed: int, scratch: str | Path | None = None):
        self.groups = LengthSortedSampler.of_chunks(*chunks, seed=seed, scratch=scratch)
        self.samplers: dict[int, TokenBudgetBatchSampler] = {}

    def of(self, max_tokens: int) -> TokenBudgetBatchSampler:
        if max_tokens not in self.samplers:
            self.samplers[max_tokens] = TokenBudgetBatchSampler.over(self.groups, max_tokens)
        return self.samplers[max_tokens]
