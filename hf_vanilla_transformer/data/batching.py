"""Batches by approximate length holding about N source and N target tokens (§5.1).

`LengthSortedSampler` orders the training pairs by length, in a random order among pairs of equal length that
changes every epoch; `TokenBudgetBatchSampler` cuts that order into batches whose padded source and padded target
each stay within `max_tokens`, then shuffles the batches. Both are deterministic given (seed, epoch), so a resumed
run sees the batches the interrupted one would have seen next (`Trainer` skips the consumed ones). Under several
processes `accelerate` hands each process every `num_processes`-th batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler


class LengthSortedSampler(Sampler[int]):
    """Indices sorted by (source length, target length), equal lengths in a random order seeded by (seed, epoch)."""

    def __init__(
        self, source_lengths: Sequence[int], target_lengths: Sequence[int], seed: int = 0, shuffle: bool = True
    ):
        self.source_lengths = np.asarray(source_lengths, dtype=np.int64)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int64)
        if self.source_lengths.shape != self.target_lengths.shape:
            raise ValueError(
                f"{len(self.source_lengths)} source lengths but {len(self.target_lengths)} target lengths."
            )
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def rng(self) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch])

    def __iter__(self) -> Iterator[int]:
        return iter(self.order(self.rng()).tolist())

    def order(self, rng: np.random.Generator) -> np.ndarray:
        order = rng.permutation(len(self.source_lengths)) if self.shuffle else np.arange(len(self.source_lengths))
        # np.lexsort sorts by the last key first, and is stable: ties keep their random order.
        return order[np.lexsort((self.target_lengths[order], self.source_lengths[order]))]

    def __len__(self) -> int:
        return len(self.source_lengths)


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
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} is invalid; expected a positive number of tokens per batch.")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"max_sentences={max_sentences} is invalid; expected None or a positive integer.")
        if len(source_lengths) == 0:
            raise ValueError("Cannot batch an empty dataset.")
        self.sampler = LengthSortedSampler(source_lengths, target_lengths, seed=seed, shuffle=shuffle)
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        self.shuffle = shuffle
        self._num_batches = len(self.batches())

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def batches(self) -> list[list[int]]:
        """This epoch's batches, in the order they are served."""
        rng = self.sampler.rng()
        order = self.sampler.order(rng)
        sources, targets = self.sampler.source_lengths[order], self.sampler.target_lengths[order]
        batches, start, longest_source, longest_target = [], 0, 0, 0
        for position in range(len(order)):
            longest_source = max(longest_source, sources[position])
            longest_target = max(longest_target, targets[position])
            size = position - start + 1
            too_many = size * longest_source > self.max_tokens or size * longest_target > self.max_tokens
            if size > 1 and (too_many or (self.max_sentences is not None and size > self.max_sentences)):
                batches.append(order[start:position].tolist())
                start, longest_source, longest_target = position, sources[position], targets[position]
        batches.append(order[start:].tolist())
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        # The sorted length sequence is the same every epoch, so the number of batches is too.
        return self._num_batches

    def tokens_per_batch(self) -> float:
        """Mean padded source + target tokens per batch."""
        total = sum(
            len(batch) * (self.sampler.source_lengths[batch].max() + self.sampler.target_lengths[batch].max())
            for batch in self.batches()
        )
        return total / self._num_batches


def accumulation_steps(tokens_per_update: int | None, max_tokens: int, num_processes: int = 1) -> int:
    """Gradient accumulation so that one update holds about `tokens_per_update` source (and as many target)
    tokens across all processes, with batches of at most `max_tokens` each."""
    if tokens_per_update is None:
        return 1
    if tokens_per_update < 1:
        raise ValueError(f"tokens_per_update={tokens_per_update} is invalid; expected a positive number.")
    return max(1, math.ceil(tokens_per_update / (max_tokens * num_processes)))
