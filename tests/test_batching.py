"""Token-budget batches (§5.1): budget kept, every pair once per epoch, disjoint shares per process, resumable."""

from __future__ import annotations

import numpy as np
import pytest
from accelerate.data_loader import BatchSamplerShard, SkipBatchSampler

from hf_vanilla_transformer.data.batching import LengthSortedSampler, TokenBudgetBatchSampler, accumulation_steps


def lengths(n: int = 500, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    source = rng.integers(1, 60, n)
    return source.tolist(), np.clip(source + rng.integers(-5, 8, n), 1, None).tolist()


def test_budget_is_kept_for_source_and_target():
    source, target = lengths()
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=400)
    for batch in sampler:
        assert len(batch) * max(source[i] for i in batch) <= 400
        assert len(batch) * max(target[i] for i in batch) <= 400
    assert sampler.tokens_per_batch() > 0.8 * 2 * 400  # length bucketing leaves little padding


def test_every_pair_once_per_epoch_and_epochs_differ():
    source, target = lengths()
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=400, seed=3)
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(len(source)))
        epochs.append(batches)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2] and epochs[0] != epochs[2]
    sampler.set_epoch(1)
    assert list(sampler) == epochs[1]  # deterministic given (seed, epoch)
    assert list(TokenBudgetBatchSampler(source, target, max_tokens=400, seed=3)) == epochs[0]


def test_batches_group_similar_lengths():
    source, target = lengths()
    for batch in TokenBudgetBatchSampler(source, target, max_tokens=400):
        longest = max(source[i] for i in batch)
        assert longest - min(source[i] for i in batch) <= max(4, 0.1 * longest)


def test_an_overlong_pair_gets_a_batch_of_its_own_and_max_sentences_caps():
    sampler = TokenBudgetBatchSampler([500, 3, 3, 3], [5, 3, 3, 3], max_tokens=100, max_sentences=2)
    batches = sorted(sampler, key=len)
    assert [0] in batches and all(len(b) <= 2 for b in batches)


def test_shares_of_several_processes_are_disjoint_and_cover_the_epoch():
    source, target = lengths()
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=400)
    shares = [list(BatchSamplerShard(sampler, num_processes=2, process_index=rank)) for rank in range(2)]
    assert len(shares[0]) == len(shares[1])
    first = {i for b in shares[0] for i in b}
    second = {i for b in shares[1] for i in b}
    full = len(sampler) - len(sampler) % 2
    # Apart from the batches accelerate repeats to give both processes as many, the shares are disjoint.
    assert len(first & second) <= max(len(b) for b in sampler)
    assert len(first | second) >= sum(len(b) for b in list(sampler)[:full])


def test_a_resumed_epoch_continues_where_it_stopped():
    source, target = lengths()
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=400, seed=1)
    sampler.set_epoch(2)
    uninterrupted = list(sampler)
    restarted = TokenBudgetBatchSampler(source, target, max_tokens=400, seed=1)
    restarted.set_epoch(2)
    assert list(SkipBatchSampler(restarted, skip_batches=7)) == uninterrupted[7:]


def test_length_sorted_sampler_is_a_permutation():
    source, target = lengths(50)
    order = list(LengthSortedSampler(source, target, seed=0))
    assert sorted(order) == list(range(50))
    assert [source[i] for i in order] == sorted(source)


def test_accumulation_reaches_the_update_size():
    assert accumulation_steps(None, 4096) == 1
    assert accumulation_steps(25000, 4096) == 7
    assert accumulation_steps(25000, 4096, num_processes=2) == 4
    assert accumulation_steps(1000, 4096) == 1
    with pytest.raises(ValueError, match="tokens_per_update=0"):
        accumulation_steps(0, 4096)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="max_tokens=0"):
        TokenBudgetBatchSampler([1], [1], max_tokens=0)
    with pytest.raises(ValueError, match="2 source lengths but 1 target"):
        TokenBudgetBatchSampler([1, 2], [1], max_tokens=10)
    with pytest.raises(ValueError, match="empty dataset"):
        TokenBudgetBatchSampler([], [], max_tokens=10)
