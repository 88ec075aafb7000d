import numpy as np
import pytest
from keras import ops

from keras_attn.models.permutation_lm_inputs import permutation_lm_inputs
from keras_attn.models.xlnet_backbone import XLNetBackbone

TOKENS = np.array([[11, 12, 13, 14, 15, 16, 17, 18], [21, 22, 23, 24, 25, 26, 0, 0]])
PADDING = (TOKENS > 0).astype("int32")


def _numpy(result):
    inputs, labels, weights = result
    return {k: ops.convert_to_numpy(v) for k, v in inputs.items()}, \
        ops.convert_to_numpy(labels), ops.convert_to_numpy(weights)


def test_same_seed_same_orders_other_seed_other_orders():
    a = _numpy(permutation_lm_inputs(TOKENS, 3, padding_mask=PADDING, seed=5))
    b = _numpy(permutation_lm_inputs(TOKENS, 3, padding_mask=PADDING, seed=5))
    c = _numpy(permutation_lm_inputs(TOKENS, 3, padding_mask=PADDING, seed=6))
    np.testing.assert_array_equal(a[0]["permutation_mask"], b[0]["permutation_mask"])
    assert not np.array_equal(a[0]["permutation_mask"], c[0]["permutation_mask"])


@pytest.mark.parametrize("seed", range(4))
def test_masks_follow_the_order(seed):
    inputs, labels, weights = _numpy(
        permutation_lm_inputs(TOKENS, 3, padding_mask=PADDING, seed=seed))
    visible, mapping = inputs["permutation_mask"].astype(bool), inputs["target_mapping"]
    for b in range(2):
        targets = np.argmax(mapping[b], axis=-1)  # (P,) positions, in order
        context = np.setdiff1d(np.arange(8), targets)
        assert not visible[b].diagonal().any()  # never its own token
        for p, i in enumerate(targets):
            # A target sees the whole context and the targets before it, nothing else.
            np.testing.assert_array_equal(
                np.flatnonzero(visible[b, i]), np.sort(np.r_[context, targets[:p]]))
        for i in context:
            np.testing.assert_array_equal(np.flatnonzero(visible[b, i]),
                                          context[context != i])
        np.testing.assert_array_equal(labels[b], TOKENS[b, targets])
        # Padding comes first in the order: never a target.
        assert PADDING[b, targets].all() and (weights[b] == 1).all()


def test_span_grouped_orders_keep_spans_together():
    inputs, _, _ = _numpy(permutation_lm_inputs(TOKENS[:1], 4, span_length=2, seed=3))
    targets = np.argmax(inputs["target_mapping"][0], axis=-1)
    assert [int(t) // 2 for t in targets[::2]] == [int(t) // 2 for t in targets[1::2]]
    assert all(targets[1::2] == targets[::2] + 1)  # left to right inside a span


def test_num_predict_longer_than_sequence_is_named():
    with pytest.raises(ValueError, match="num_predict"):
        permutation_lm_inputs(TOKENS, 9)


def test_no_leak_in_the_query_stream_and_content_sees_its_token():
    backbone = XLNetBackbone(vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=16,
                             intermediate_dim=32, dropout=0.0, two_stream=True)
    inputs, _, _ = _numpy(permutation_lm_inputs(TOKENS, 3, padding_mask=PADDING, seed=1))
    base = backbone.predict_on_batch(inputs)
    for p in range(3):
        changed = {k: v.copy() for k, v in inputs.items()}
        positions = np.argmax(inputs["target_mapping"][:, p], axis=-1)
        changed["token_ids"][np.arange(2), positions] = 29
        out = backbone.predict_on_batch(changed)
        # The query stream predicting x_{z_t} never sees x_{z_t} ...
        np.testing.assert_allclose(out["query_output"][:, p], base["query_output"][:, p],
                                   atol=1e-6)
        # ... while the content stream at z_t does.
        for b, i in enumerate(positions):
            assert np.abs(out["sequence_output"][b, i] - base["sequence_output"][b, i]).max() > 1e-3


def test_order_noise_replaces_the_draw():
    noise = np.array([[0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 0.8, 0.4]])
    inputs, labels, _ = _numpy(permutation_lm_inputs(TOKENS[:1], 3, order_noise=noise))
    # Order by increasing noise: 1, 5, 3, 7, 2, 4, 6, 0; the last three are the targets.
    np.testing.assert_array_equal(np.argmax(inputs["target_mapping"][0], -1), [4, 6, 0])
    np.testing.assert_array_equal(labels[0], TOKENS[0, [4, 6, 0]])
