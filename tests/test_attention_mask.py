import numpy as np
import pytest
from keras import ops

from keras_attn.layers.attention_mask import causal_mask
from keras_attn.layers.attention_mask import merge_attention_masks
from keras_attn.layers.attention_mask import sliding_window_mask


def test_causal_mask_is_the_notes_lower_triangle():
    # 002_9e7f19a439536fe2.txt: M is 0 on and below the diagonal, -inf above it.
    np.testing.assert_array_equal(
        ops.convert_to_numpy(causal_mask(4, 4))[0], np.tril(np.ones((4, 4), bool))
    )


def test_causal_mask_aligns_queries_with_the_end_of_the_keys():
    # Keys = [3 memory positions; 2 current]: query i sits at absolute position 3 + i.
    mask = ops.convert_to_numpy(causal_mask(2, 5))[0]
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    # During cached decoding the start is explicit: token 1 of a 4-slot cache.
    mask = ops.convert_to_numpy(causal_mask(1, 4, query_start_index=1))[0]
    np.testing.assert_array_equal(mask, [[1, 1, 0, 0]])


def test_sliding_window_band():
    mask = ops.convert_to_numpy(sliding_window_mask(5, 5, 2))[0]
    expected = np.abs(np.arange(5)[:, None] - np.arange(5)[None]) < 2
    np.testing.assert_array_equal(mask, expected)


def test_merge_ands_every_source():
    rng = np.random.default_rng(0)
    query_mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    key_mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool)
    explicit = rng.random((2, 4, 4)) > 0.3
    merged = merge_attention_masks(
        4, 4, query_mask=query_mask, key_mask=key_mask, attention_mask=explicit,
        use_causal_mask=True, sliding_window=3,
    )
    i, j = np.arange(4)[:, None], np.arange(4)[None]
    expected = (
        query_mask[:, :, None] & key_mask[:, None, :] & explicit & (j <= i) & (np.abs(i - j) < 3)
    )
    np.testing.assert_array_equal(ops.convert_to_numpy(merged), expected)
    assert merge_attention_masks(4, 4) is None


def test_rank_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"`attention_mask` must have rank 2 or 3 or 4.*\(2, 1, 1"):
        merge_attention_masks(4, 4, attention_mask=np.ones((2, 1, 1, 4, 4), bool))
    with pytest.raises(ValueError, match="`padding_mask` must have rank 2"):
        merge_attention_masks(4, 4, key_mask=np.ones((2, 4, 1), bool))
    with pytest.raises(ValueError, match="Received: sliding_window=0"):
        merge_attention_masks(4, 4, sliding_window=0)


def test_per_head_attention_mask_merges_with_the_other_sources():
    rng = np.random.default_rng(3)
    per_head = rng.random((2, 3, 4, 4)) > 0.3  # (B, H, T, S)
    padding = rng.random((2, 4)) > 0.2  # (B, S)
    merged = ops.convert_to_numpy(merge_attention_masks(
        4, 4, key_mask=padding, attention_mask=per_head, use_causal_mask=True))
    expected = per_head & padding[:, None, None, :] & np.tril(np.ones((4, 4), bool))
    np.testing.assert_array_equal(merged, expected)
