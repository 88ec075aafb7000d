"""BatchStream: what an epoch contains, determinism, bucketing, weights and sharding.

The invariants are checked by counting, never by re-running the stream's own code:
- without bucketing, micro-batch s holds positions [s B, (s + 1) B) of an endless sequence
  in which every run of n consecutive positions starting at a multiple of n (an epoch) is
  a permutation of the n examples;
- bucketing only reorders within windows of 64 micro-batches: a window holds the same
  examples (as a multiset) with and without it;
- weights: batch(s) = raw(s) * k / (sum of raw over the k micro-batches of its update), so
  over an update the weights sum to k and are proportional to the raw weights.
"""

import math
import random

import numpy as np
import pytest

from keras_attn.training.tasks.batch_stream import WINDOW_BATCHES
from keras_attn.training.tasks.batch_stream import BatchStream

pytestmark = pytest.mark.tensorflow


def collate_ids(batch):
    """x: the example ids (rows), y: twice the ids, raw weights: 1 per example."""
    ids = np.array([e["id"] for e in batch], np.int64)
    return {"ids": ids}, ids * 2, np.ones(len(batch), np.float32)


def collate_tokens(batch):
    """Pads to the longest example; a raw weight per token (1 real, 0 padding)."""
    width = max(e["length"] for e in batch)
    tokens = np.zeros((len(batch), width), np.int64)
    weights = np.zeros((len(batch), width), np.float32)
    for row, example in enumerate(batch):
        tokens[row, : example["length"]] = example["id"] + 1
        weights[row, : example["length"]] = 1.0
    return {"tokens": tokens}, None, weights


def make_stream(n=10, batch=4, seed=0, accumulation=1, bucket=False, lengths=None,
                collate=collate_ids):
    if lengths is None:
        lengths = np.random.default_rng(99).integers(1, 30, size=n)
    examples = [{"id": i, "length": int(length)} for i, length in enumerate(lengths)]
    return BatchStream(examples, collate, lengths, global_batch_size=batch, seed=seed,
                       accumulation_steps=accumulation, bucket_by_length=bucket)


def sequence(stream, steps):
    return np.concatenate([stream.indices(s) for s in range(steps)])


@pytest.mark.parametrize("n, batch", [(10, 4), (12, 4), (7, 3), (5, 8), (1, 2)])
def test_each_epoch_is_a_permutation_across_batch_boundaries(n, batch):
    stream = make_stream(n=n, batch=batch, seed=3)
    epochs = 4
    steps = math.ceil(epochs * n / batch)
    positions = sequence(stream, steps)
    assert len(positions) == steps * batch
    for epoch in range(epochs):
        chunk = positions[epoch * n: (epoch + 1) * n]
        assert sorted(chunk.tolist()) == list(range(n)), epoch
    # Consecutive epochs are shuffled differently (n > 2: identical orders are unlikely).
    if n >= 7:
        assert positions[:n].tolist() != positions[n: 2 * n].tolist()


def test_an_epoch_boundary_inside_a_batch_drops_and_repeats_nothing():
    stream = make_stream(n=10, batch=4)
    straddling = stream.indices(2)  # positions 8..11: two of epoch 0, two of epoch 1
    first_epoch = np.concatenate([stream.indices(0), stream.indices(1), straddling[:2]])
    assert sorted(first_epoch.tolist()) == list(range(10))
    second_epoch = np.concatenate([straddling[2:], stream.indices(3), stream.indices(4)])
    assert sorted(second_epoch.tolist()) == list(range(10))


@pytest.mark.parametrize("n, batch, k, expected", [(10, 4, 1, 3), (10, 4, 2, 4), (12, 4, 3, 3),
                                                   (13, 4, 3, 6), (4, 4, 1, 1)])
def test_steps_per_epoch_is_rounded_up_to_whole_updates(n, batch, k, expected):
    assert make_stream(n=n, batch=batch, accumulation=k).steps_per_epoch == expected


def test_bucketing_keeps_what_each_window_contains():
    n, batch = 45, 4  # a window of 64 batches = 256 positions = 5.7 epochs
    plain = make_stream(n=n, batch=batch, seed=5)
    bucketed = make_stream(n=n, batch=batch, seed=5, bucket=True)
    for window in range(2):
        steps = range(window * WINDOW_BATCHES, (window + 1) * WINDOW_BATCHES)
        a = np.concatenate([plain.indices(s) for s in steps])
        b = np.concatenate([bucketed.indices(s) for s in steps])
        np.testing.assert_array_equal(np.bincount(a, minlength=n), np.bincount(b, minlength=n))
        assert a.tolist() != b.tolist()  # but in another order
    # Whole epochs over the two windows (512 positions = 11 epochs + 17): every example
    # appears 11 or 12 times.
    counts = np.bincount(sequence(bucketed, 2 * WINDOW_BATCHES), minlength=n)
    assert set(counts.tolist()) == {11, 12} and counts.sum() == 512
    assert (counts == 12).sum() == 512 - 11 * n


def test_bucketed_batches_are_contiguous_runs_of_the_sorted_window():
    n, batch = 256, 4  # one window == one epoch
    lengths = np.random.default_rng(0).integers(1, 100, size=n)
    stream = make_stream(n=n, batch=batch, bucket=True, lengths=lengths)
    batches = [np.sort(lengths[stream.indices(s)]) for s in range(WINDOW_BATCHES)]
    # Sorted by length, the batches tile the window's sorted lengths without overlap.
    ordered = sorted(batches, key=lambda b: (b[0], b[-1]))
    np.testing.assert_array_equal(np.concatenate(ordered), np.sort(lengths))


def test_bucketing_lowers_padding():
    n, batch = 2048, 16
    lengths = np.random.default_rng(7).integers(1, 129, size=n)

    def padding(stream):
        total = 0
        for s in range(stream.steps_per_epoch):
            chosen = lengths[stream.indices(s)]
            total += int(chosen.max()) * len(chosen) - int(chosen.sum())
        return total

    plain = padding(make_stream(n=n, batch=batch, lengths=lengths))
    bucketed = padding(make_stream(n=n, batch=batch, lengths=lengths, bucket=True))
    real = int(lengths.sum())
    # Random batches of 16 lengths ~U[1, 128] pad to ~E[max] = 121: about as much padding
    # as real tokens. Sorted windows of 1024 leave a few tokens per row.
    assert plain > 0.8 * real
    assert bucketed < 0.1 * plain


@pytest.mark.parametrize("bucket", [False, True])
def test_deterministic_for_a_seed_different_for_another(bucket):
    steps = range(0, 3 * WINDOW_BATCHES, 7)
    first = [make_stream(n=50, seed=11, bucket=bucket).indices(s).tolist() for s in steps]
    again = [make_stream(n=50, seed=11, bucket=bucket).indices(s).tolist() for s in steps]
    other = [make_stream(n=50, seed=12, bucket=bucket).indices(s).tolist() for s in steps]
    assert first == again
    assert first != other


@pytest.mark.parametrize("k", [1, 2, 3])
def test_weights_are_normalized_over_each_update(k):
    n, batch = 23, 4
    stream = make_stream(n=n, batch=batch, accumulation=k, collate=collate_tokens,
                         lengths=np.random.default_rng(1).integers(1, 9, size=n))
    for update in range(5):
        steps = range(update * k, (update + 1) * k)
        raws = [stream.raw_batch(s)[2] for s in steps]
        weights = [stream.batch(s)[2] for s in steps]
        total_raw = sum(float(r.sum()) for r in raws)
        # Raw token counts differ between the micro-batches; the weights still sum to k.
        assert sum(float(w.sum()) for w in weights) == pytest.approx(k, rel=1e-6)
        for raw, weight in zip(raws, weights):
            assert weight.dtype == np.float32 and weight.shape == raw.shape
            np.testing.assert_allclose(weight, raw * k / total_raw, rtol=1e-6)
            assert np.all(weight[raw == 0] == 0)


def test_update_with_no_counted_weight_gets_zero_weights():
    def collate(batch):
        return {"ids": np.array([e["id"] for e in batch])}, None, np.zeros(len(batch))

    stream = make_stream(n=6, batch=2, accumulation=2, collate=collate)
    _, _, weights = stream.batch(1)
    assert weights.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("bucket, k", [(False, 1), (True, 2), (True, 3)])
def test_random_access_equals_sequential(bucket, k):
    n, batch, steps = 37, 4, 3 * WINDOW_BATCHES + 5
    lengths = np.random.default_rng(4).integers(1, 12, size=n)
    sequential = make_stream(n=n, batch=batch, bucket=bucket, accumulation=k,
                             collate=collate_tokens, lengths=lengths)
    expected = [sequential.batch(s) for s in range(steps)]
    shuffled = make_stream(n=n, batch=batch, bucket=bucket, accumulation=k,
                           collate=collate_tokens, lengths=lengths)
    order = list(range(steps)) * 2
    random.Random(0).shuffle(order)
    for s in order:  # jumps across windows, epochs and updates, and repeats
        x, y, w = shuffled.batch(s)
        np.testing.assert_array_equal(x["tokens"], expected[s][0]["tokens"])
        np.testing.assert_array_equal(w, expected[s][2])
        assert y is None
        assert shuffled.tokens(s) == int(lengths[shuffled.indices(s)].sum())


def test_tokens_counts_unpadded_tokens():
    lengths = np.array([3, 1, 2, 5, 4, 4])
    stream = make_stream(n=6, batch=3, lengths=lengths)
    total = sum(stream.tokens(s) for s in range(2))
    assert total == lengths.sum()  # one epoch, exactly
    assert stream.tokens(0) == int(lengths[stream.indices(0)].sum())


def test_no_examples():
    with pytest.raises(ValueError, match="no training examples"):
        BatchStream([], collate_ids, [], global_batch_size=2, seed=0)


def as_numpy(element):
    import tensorflow as tf

    return tf.nest.map_structure(lambda t: t.numpy(), element)


@pytest.mark.parametrize("num_shards, shards", [(1, (0,)), (2, (0, 1)), (4, (2, 3)),
                                                (4, (3, 1))])
def test_dataset_yields_row_slices_of_each_step_in_shard_order(num_shards, shards):
    n, batch = 30, 8
    stream = make_stream(n=n, batch=batch, accumulation=2, seed=1)
    start, stop = 3, 7
    elements = [as_numpy(e) for e in stream.dataset(start, stop, num_shards, shards)]
    assert len(elements) == (stop - start) * len(shards)
    rows = batch // num_shards
    for i, (x, y, w) in enumerate(elements):
        step, shard = start + i // len(shards), shards[i % len(shards)]
        full_x, full_y, full_w = stream.batch(step)
        part = slice(shard * rows, (shard + 1) * rows)
        np.testing.assert_array_equal(x["ids"], full_x["ids"][part])
        np.testing.assert_array_equal(y, full_y[part])
        np.testing.assert_array_equal(w, full_w[part])
        assert x["ids"].shape == (rows,)
    if num_shards == 2:
        # Both shards of all steps: every row of every micro-batch, once.
        ids = np.concatenate([x["ids"] for x, _, _ in elements])
        np.testing.assert_array_equal(ids, np.concatenate(
            [stream.indices(s) for s in range(start, stop)]))


def test_dataset_without_targets_and_with_ragged_lengths():
    stream = make_stream(n=9, batch=3, collate=collate_tokens, bucket=True)
    elements = [as_numpy(e) for e in stream.dataset(0, 4)]
    assert len(elements) == 4 and all(len(e) == 2 for e in elements)  # (x, weights)
    for step, (x, w) in enumerate(elements):
        expected_x, _, expected_w = stream.batch(step)
        np.testing.assert_array_equal(x["tokens"], expected_x["tokens"])
        np.testing.assert_array_equal(w, expected_w)
    # Different steps pad to different widths in one dataset.
    assert len({x["tokens"].shape[1] for x, _ in elements}) > 1


def test_dataset_needs_a_batch_that_divides_over_the_shards():
    stream = make_stream(n=9, batch=6)
    with pytest.raises(ValueError, match=r"the global batch \(6\) must divide evenly over "
                                         r"4 replicas; change train\.global_batch_size"):
        stream.dataset(0, 2, num_shards=4, shards=(0,))
