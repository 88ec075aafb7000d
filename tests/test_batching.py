"""SequenceBatcher: truncation counts, dynamic padding, buckets, static shapes."""

import pytest
import tensorflow as tf

from keras_attn.text.batching import SequenceBatcher
from keras_attn.text.batching import TruncationCounter

# keras_attn.text is TensorFlow code (tf-text, tf.data) whatever the Keras backend.
pytestmark = pytest.mark.tensorflow

LENGTHS = [3, 5, 9, 12, 2, 7, 4, 6]


def crafted_dataset(lengths=LENGTHS):
    """Example i: token_ids = [2, 100*i + 1, ..., 100*i + L-2, 3], labels = positions, label i."""
    def generator():
        for i, length in enumerate(lengths):
            body = [100 * i + k for k in range(1, length - 1)]
            yield {"token_ids": [2] + body + [3], "labels": [-100] + list(range(1, length - 1))
                   + [-100], "padding_mask": [True] * length, "label": i}

    signature = {"token_ids": tf.TensorSpec((None,), tf.int32),
                 "labels": tf.TensorSpec((None,), tf.int32),
                 "padding_mask": tf.TensorSpec((None,), tf.bool),
                 "label": tf.TensorSpec((), tf.int32)}
    return tf.data.Dataset.from_generator(generator, output_signature=signature)


def examples(dataset):
    """Unpadded examples of a batched dataset, keyed by the scalar label."""
    result = {}
    for batch in dataset:
        for row in range(int(batch["label"].shape[0])):
            mask = batch["padding_mask"][row].numpy()
            result[int(batch["label"][row])] = {
                "token_ids": batch["token_ids"][row].numpy()[mask].tolist(),
                "labels": batch["labels"][row].numpy()[mask].tolist(),
                "padded_labels": batch["labels"][row].numpy()[~mask].tolist(),
            }
    return result


def test_truncation_is_counted_and_keeps_the_last_token():
    batcher = SequenceBatcher(batch_size=3, sequence_length=6)
    got = examples(batcher(crafted_dataset()))
    assert batcher.truncation.result() == {
        "examples": 8, "truncated_examples": 3,
        "truncated_tokens": (9 - 6) + (12 - 6) + (7 - 6)}
    assert got[3]["token_ids"] == [2, 301, 302, 303, 304, 3]
    assert got[3]["labels"] == [-100, 1, 2, 3, 4, -100]
    assert got[0]["token_ids"] == [2, 1, 3]
    # Counts accumulate over epochs until reset.
    list(batcher(crafted_dataset()))
    assert batcher.truncation.result()["truncated_tokens"] == 20
    batcher.truncation.reset()
    assert batcher.truncation.result() == TruncationCounter().result()


def test_truncation_without_keeping_the_last_token():
    batcher = SequenceBatcher(batch_size=8, sequence_length=4, keep_last_token=False)
    got = examples(batcher(crafted_dataset()))
    assert got[3]["token_ids"] == [2, 301, 302, 303]
    assert batcher.truncation.result()["truncated_examples"] == 5  # lengths 5, 9, 12, 7, 6


def test_dynamic_padding_pads_each_batch_to_its_longest():
    batches = list(SequenceBatcher(batch_size=3)(crafted_dataset()))
    assert [tuple(b["token_ids"].shape) for b in batches] == [(3, 9), (3, 12), (2, 6)]
    first = batches[0]
    assert first["token_ids"][0].numpy().tolist() == [2, 1, 3] + [0] * 6
    assert first["labels"][0].numpy().tolist()[3:] == [-100] * 6  # ignored by the loss
    assert first["padding_mask"][0].numpy().tolist() == [True] * 3 + [False] * 6
    assert examples(batches)[5]["padded_labels"] == [-100] * 5


def test_static_shape_batches():
    batcher = SequenceBatcher(batch_size=3, sequence_length=8, static_shape=True)
    dataset = batcher(crafted_dataset())
    assert tuple(dataset.element_spec["token_ids"].shape) == (3, 8)
    assert tuple(dataset.element_spec["label"].shape) == (3,)
    batches = list(dataset)
    assert len(batches) == 2  # 8 examples: the last partial batch is dropped for static shapes
    assert all(tuple(b["token_ids"].shape) == (3, 8) for b in batches)
    kept = SequenceBatcher(batch_size=3, sequence_length=8, static_shape=True,
                           drop_remainder=False)(crafted_dataset())
    assert [tuple(b["labels"].shape) for b in kept] == [(3, 8), (3, 8), (2, 8)]


def test_buckets_group_similar_lengths_and_keep_every_example():
    batcher = SequenceBatcher(batch_size=2, bucket_boundaries=[5, 8])
    lengths = [3, 5, 9, 12, 2, 7, 4, 6, 10, 3]
    batches = list(batcher(crafted_dataset(lengths)))
    seen = []
    for batch in batches:
        row_lengths = tf.reduce_sum(tf.cast(batch["padding_mask"], tf.int32), axis=1).numpy()
        buckets = {sum(length >= b for b in (5, 8)) for length in row_lengths}
        assert len(buckets) == 1, row_lengths  # one bucket per batch
        assert batch["token_ids"].shape[1] == max(row_lengths)
        seen += batch["label"].numpy().tolist()
    assert sorted(seen) == list(range(len(lengths)))


def test_batcher_errors():
    with pytest.raises(ValueError, match="sequence_length"):
        SequenceBatcher(batch_size=2, static_shape=True)
    with pytest.raises(ValueError, match="bucket_boundaries"):
        SequenceBatcher(batch_size=2, bucket_boundaries=[8, 4])
    with pytest.raises(ValueError, match="bucket_batch_sizes"):
        SequenceBatcher(batch_size=2, bucket_boundaries=[4], bucket_batch_sizes=[1])
    with pytest.raises(ValueError, match="batch_size"):
        SequenceBatcher(batch_size=0)
    with pytest.raises(ValueError, match="Sequence key 'tokens'"):
        SequenceBatcher(batch_size=2, sequence_keys=["tokens"])(crafted_dataset())
    mismatched = tf.data.Dataset.from_tensors({"token_ids": [1, 2, 3], "labels": [0, 0]})
    with pytest.raises(tf.errors.InvalidArgumentError, match="one length per example"):
        list(SequenceBatcher(batch_size=2)(mismatched))
