"""Token-budget batches (§5.1): budget kept, every pair once per epoch, disjoint shares per process, resumable."""

from __future__ import annotations

import itertools

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


# The batches of the pair-by-pair rule this sampler replaced (recorded from it, seed 5): the vectorised sampler must
# serve exactly these, in this order, epoch after epoch.
PINNED_SOURCES = [2, 2, 9, 6, 7, 7, 8, 1, 6, 2, 5, 11, 7, 1, 6, 2, 9, 11, 11, 7, 10, 5, 2, 6]
PINNED_TARGETS = [2, 3, 12, 4, 9, 4, 7, 3, 4, 3, 5, 11, 10, 3, 8, 2, 12, 14, 8, 5, 9, 5, 4, 6]
PINNED_EPOCHS = [
    [[11], [17], [3, 8, 23], [16], [19, 4], [2], [12, 6], [14, 5], [7, 13, 15, 0, 9, 1], [20], [18], [22, 10, 21]],
    [[14, 5], [17], [20], [18], [7, 13, 15, 0, 9, 1], [2], [8, 3, 23], [19, 4], [22, 21, 10], [16], [12, 6], [11]],
]
PINNED_UNSHUFFLED = [
    [7, 13, 0],
    [15, 1, 9],
    [22, 10, 21],
    [3, 8, 23],
    [14, 5],
    [19, 4],
    [12, 6],
    [2],
    [16],
    [20],
    [18],
    [11],
    [17],
]


def test_the_batches_of_a_seed_are_those_the_pair_by_pair_rule_served():
    sampler = TokenBudgetBatchSampler(PINNED_SOURCES, PINNED_TARGETS, max_tokens=20, seed=5)
    for epoch, expected in enumerate(PINNED_EPOCHS):
        sampler.set_epoch(epoch)
        assert list(sampler) == expected
    unshuffled = TokenBudgetBatchSampler(
        PINNED_SOURCES, PINNED_TARGETS, max_tokens=20, seed=5, shuffle=False, max_sentences=3
    )
    assert list(unshuffled) == PINNED_UNSHUFFLED


@pytest.mark.parametrize(
    ("max_tokens", "max_sentences", "epoch", "count", "digest", "padded"),
    [
        (1024, None, 0, 1342, "58ca8d7ac940aaf9", 1861.8621),
        (1024, None, 4, 1342, "8bd2914c609a8741", 1861.8621),
        (4096, 64, 0, 400, "38c50123ed992472", 6430.9325),
        (4096, 64, 4, 400, "8a3677dc657a7e0d", 6430.9325),
    ],
)
def test_20000_pairs_give_the_pinned_batches(max_tokens, max_sentences, epoch, count, digest, padded):
    """20,000 pairs of 1-120 tokens with an overlong one: the digest of the pair-by-pair rule's batches."""
    import hashlib
    import json

    rng = np.random.default_rng(7)
    source = rng.integers(1, 120, 20000)
    target = np.clip(source + rng.integers(-10, 15, 20000), 1, 300)
    source[5] = 5000
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=max_tokens, seed=3, max_sentences=max_sentences)
    sampler.set_epoch(epoch)
    batches = list(sampler)
    assert len(batches) == len(sampler) == count
    assert hashlib.sha256(json.dumps(batches).encode()).hexdigest()[:16] == digest
    assert round(sampler.tokens_per_batch(), 4) == padded


def test_the_calibration_sample_stands_for_the_batches_served_with_shapes_of_its_own():
    source, target = lengths(3000, seed=3)
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=600, seed=4)
    served = list(sampler)  # epoch 0

    def shape(batch):
        return (len(batch), max(source[i] for i in batch), max(target[i] for i in batch))

    distinct = {shape(batch) for batch in served}
    everything = sampler.shape_sample(10**6)  # fewer shapes than asked: one batch of each
    assert len(everything) == len(distinct) == 171 and all(batch in served for batch in everything)
    # One batch stands for the epoch's middle: the median of its 177 batches by pairs (13), not the fewest (5).
    assert [len(batch) for batch in sampler.shape_sample(1)] == [13] and sorted(map(len, served))[88] == 13
    taken: set = set()
    first = sampler.shape_sample(5, taken=taken)
    # The midpoints of five equal shares of the batches by pairs: the rare extremes (5 and 75 pairs) left out.
    assert [len(batch) for batch in first] == [10, 11, 13, 17, 30]
    assert (min(map(len, served)), max(map(len, served))) == (5, 75)
    second = sampler.shape_sample(5, taken=taken)  # a second candidate's: none of the first's shapes
    assert len(taken) == 10 and not {shape(b) for b in first} & {shape(b) for b in second}
    rounded = sampler.shape_sample(10**6, multiple=8)
    assert len(rounded) < len(distinct)  # rounded up to multiples of 8, shapes merge


def test_the_batch_shapes_are_counted_as_the_collator_pads_them():
    """Each new batch shape costs its first update more (the calibration measures it); the run counts the shapes
    it meets: (pairs, longest source, longest target), the lengths rounded up to the collator's multiple."""
    # Lengths 1..4 on both sides, at most 8 tokens per side: one batch of 8 pairs of length 1, two of 4 pairs of
    # length 2, two of 2 pairs of length 3, two of 2 pairs of length 4.
    source = [1] * 8 + [2] * 8 + [3] * 4 + [4] * 4
    sampler = TokenBudgetBatchSampler(source, source, max_tokens=8, seed=0)
    assert len(sampler) == 7
    assert sorted(sampler.shape_counts().tolist()) == [1, 2, 2, 2]
    assert sorted(sampler.shape_counts(multiple=8).tolist()) == [1, 2, 4]  # padded to 8: lengths 3 and 4 alike
    assert sampler.shapes_met(7) == sampler.shapes_met(10**6) == 4.0  # a whole epoch meets every shape
    assert sampler.shapes_met(7, multiple=8) == 3.0
    assert sampler.shapes_met(0) == 0.0
    # 3 of the 7 batches: a shape of c batches is missed with probability about (1 - 3/7)^c.
    assert sampler.shapes_met(3) == pytest.approx(3 / 7 + 3 * (1 - (4 / 7) ** 2))


def test_batch_sizes_over_one_shared_set_of_length_groups_are_the_batches_of_their_own():
    """The run builds one `LengthSortedSampler` and cuts every batch size the planner tries over it (its groups
    shared, not copied): each gives the batches a sampler built from the lengths gives, epoch by epoch, and moving
    one to another epoch leaves the others where they are."""
    source, target = lengths(700, seed=2)
    shared = LengthSortedSampler(source, target, seed=4)
    small, large = TokenBudgetBatchSampler.over(shared, 300), TokenBudgetBatchSampler.over(shared, 900)
    assert small.sampler.groups is large.sampler.groups is shared.groups
    large.set_epoch(2)
    assert small.epoch == 0 and list(small) == list(TokenBudgetBatchSampler(source, target, max_tokens=300, seed=4))
    alone = TokenBudgetBatchSampler(source, target, max_tokens=900, seed=4)
    alone.set_epoch(2)
    assert list(large) == list(alone) and large.tokens_per_batch() == alone.tokens_per_batch()
    with pytest.raises(ValueError, match="max_tokens=0 is invalid"):
        TokenBudgetBatchSampler.over(shared, 0)


@pytest.mark.parametrize("longest", [60, 5000])  # a table of every key; sorted distinct keys (too many for a table)
def test_length_groups_made_chunk_by_chunk_are_those_of_the_whole_lengths(longest):
    rng = np.random.default_rng(longest)
    source = rng.integers(1, longest, 2000)
    target = np.clip(source + rng.integers(-5, 8, 2000), 1, None)
    whole = LengthSortedSampler(source, target, seed=7)
    cuts = [0, 1, 1, 700, 1999, 2000]  # chunks of every size, an empty one among them
    chunked = LengthSortedSampler.of_chunks(
        [source[a:b].astype(np.int32) for a, b in itertools.pairwise(cuts)],
        [target[a:b].astype(np.int32) for a, b in itertools.pairwise(cuts)],
        seed=7,
    )
    assert chunked.groups.dtype == np.uint16 and np.array_equal(chunked.groups, whole.groups)
    assert np.array_equal(chunked.group_sources, whole.group_sources) and list(chunked) == list(whole)
    # The groups rank (source, target) as the §5.1 sort orders them.
    keys = list(zip(whole.group_sources.tolist(), whole.group_targets.tolist(), strict=True))
    assert keys == sorted(set(zip(source.tolist(), target.tolist(), strict=True)))
    with pytest.raises(ValueError, match="chunks differ"):
        LengthSortedSampler.of_chunks([source], [target[:-1]])


def test_an_epochs_order_is_the_stable_sort_of_a_permutation_also_in_file_backed_maps(tmp_path, monkeypatch):
    """The epoch's order (a permutation stably sorted by length group, made by a counting sort a chunk at a time) is
    `permutation[argsort(groups[permutation], stable)]`; with a scratch folder, a large split's groups and order lie
    in file-backed maps of unlinked files there, and the batches are the same."""
    from hf_vanilla_transformer.data import batching

    monkeypatch.setattr(batching, "KEY_CHUNK", 97)  # many chunks
    source, target = (np.asarray(side, dtype=np.int32) for side in lengths(3000, seed=5))
    memory = LengthSortedSampler.of_chunks([source], [target], seed=3)
    permutation = np.arange(3000, dtype=np.uint32)
    rng = np.random.default_rng([3, 0])
    rng.shuffle(permutation)
    expected = permutation[np.argsort(memory.groups[permutation], kind="stable")]
    assert np.array_equal(memory.order(np.random.default_rng([3, 0])), expected)
    monkeypatch.setattr(batching, "SCRATCH_FROM", 1000)
    mapped = LengthSortedSampler.of_chunks([source], [target], seed=3, scratch=tmp_path / "scratch")
    order = mapped.order(np.random.default_rng([3, 0]))
    assert isinstance(mapped.groups, np.memmap) and isinstance(order, np.memmap)
    assert np.array_equal(order, expected) and np.array_equal(mapped.groups, memory.groups)
    assert not list((tmp_path / "scratch").iterdir())  # unlinked: their space goes with the arrays
    for epoch in (0, 1):
        ours, theirs = TokenBudgetBatchSampler.over(mapped, 400), TokenBudgetBatchSampler.over(memory, 400)
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert list(ours) == list(theirs)
