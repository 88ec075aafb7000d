"""MaskedSparseCategoricalCrossentropy against numpy references: the masked mean over
labelled tokens (BERT token classification / masked LM, `-100` labels) and label
smoothing over non-padding tokens (seq2seq Transformer), reductions, config, errors."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.models.masked_sparse_categorical_crossentropy import (
    MaskedSparseCategoricalCrossentropy,
)


def numpy_smoothed_loss(labels, logits, eps, ignore):
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    vocab = logits.shape[-1]
    q = np.full(logits.shape, eps / vocab)
    np.put_along_axis(q, np.where(labels == ignore, 0, labels)[..., None],
                      1 - eps + eps / vocab, axis=-1)
    per_token = -(q * log_probs).sum(-1)
    real = labels != ignore
    return per_token[real].sum() / real.sum()


# === Masked mean over labelled tokens (ignore_class=-100) ===


def test_masked_loss_matches_numpy_mean_over_labelled_tokens():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 4)).astype("float32")
    labels = rng.integers(0, 4, (3, 5))
    labels[0, 0] = labels[1, 3:] = labels[2, :] = -100
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    keep = labels != -100
    expected = -np.mean([log_p[b, t, labels[b, t]] for b, t in zip(*np.nonzero(keep))])
    loss = MaskedSparseCategoricalCrossentropy()
    assert float(loss(labels, logits)) == pytest.approx(expected, rel=1e-5)
    # Same as HF/PyTorch CrossEntropyLoss(ignore_index=-100): padding adds nothing.
    wider = np.concatenate([labels, np.full((3, 4), -100)], 1)
    wider_logits = np.concatenate([logits, rng.normal(size=(3, 4, 4)).astype("float32")], 1)
    assert float(loss(wider, wider_logits)) == pytest.approx(expected, rel=1e-5)
    per_token = ops.convert_to_numpy(
        MaskedSparseCategoricalCrossentropy(reduction="none")(labels, logits))
    assert np.all(per_token[~keep] == 0) and per_token.mean() == pytest.approx(expected, 1e-5)
    summed = MaskedSparseCategoricalCrossentropy(reduction="sum")(labels, logits)
    assert float(summed) == pytest.approx(expected * keep.sum(), rel=1e-5)
    assert float(loss(np.full((2, 3), -100), logits[:2, :3])) == 0.0
    # Without smoothing it is Keras' sparse cross-entropy restricted to the kept tokens.
    keras_losses = ops.convert_to_numpy(keras.losses.sparse_categorical_crossentropy(
        np.where(keep, labels, 0), logits, from_logits=True))
    assert float(loss(labels, logits)) == pytest.approx(keras_losses[keep].mean(), rel=1e-5)


# === Label smoothing, padding id ignored (seq2seq) ===


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_matches_numpy_and_ignores_padding(eps):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 7)).astype("float32")
    labels = np.array([[3, 4, 2, 0, 0], [5, 2, 0, 0, 0], [1, 6, 6, 6, 2]])
    loss = MaskedSparseCategoricalCrossentropy(ignore_class=0, label_smoothing=eps)
    value = float(loss(labels, logits))
    np.testing.assert_allclose(value, numpy_smoothed_loss(labels, logits, eps, 0), rtol=1e-5)
    # Same as Keras' dense label smoothing averaged over the real tokens only.
    real = labels != 0
    keras_loss = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=eps, reduction=None
    )
    dense = ops.convert_to_numpy(keras_loss(np.eye(7)[labels], logits))
    np.testing.assert_allclose(value, dense[real].mean(), rtol=1e-5)
    # More padding leaves the loss unchanged.
    padded = float(loss(np.pad(labels, ((0, 0), (0, 3))), np.pad(logits, ((0, 0), (0, 3), (0, 0)))))
    np.testing.assert_allclose(padded, value, rtol=1e-5)


def test_label_smoothing_with_minus_100_labels_and_float16_logits():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 4, 5)).astype("float32")
    labels = np.array([[-100, 3, 1, -100], [4, -100, -100, 0]])
    loss = MaskedSparseCategoricalCrossentropy(label_smoothing=0.2)
    expected = numpy_smoothed_loss(labels, logits, 0.2, -100)
    np.testing.assert_allclose(float(loss(labels, logits)), expected, rtol=1e-5)
    # The log-softmax runs in float32 whatever the logits' dtype.
    half = float(loss(labels, logits.astype("float16")))
    expected_half = numpy_smoothed_loss(labels, logits.astype("float16").astype("float64"),
                                        0.2, -100)
    np.testing.assert_allclose(half, expected_half, rtol=1e-5)


def test_probabilities_sample_weight_and_config():
    probs = np.array([[[0.5, 0.25, 0.25], [0.2, 0.6, 0.2]]], "float32")
    labels = np.array([[2, 1]])
    loss = MaskedSparseCategoricalCrossentropy(ignore_class=None, from_logits=False)
    np.testing.assert_allclose(float(loss(labels, probs)), -(np.log(0.25) + np.log(0.6)) / 2,
                               rtol=1e-5)
    weighted = float(loss(labels, probs, sample_weight=np.array([[1.0, 0.0]])))
    np.testing.assert_allclose(weighted, -np.log(0.25) / 2, rtol=1e-5)
    restored = MaskedSparseCategoricalCrossentropy.from_config(loss.get_config())
    assert restored.get_config() == loss.get_config()


def test_config_round_trip_through_keras_serialization():
    loss = MaskedSparseCategoricalCrossentropy(ignore_class=-1, label_smoothing=0.1,
                                               from_logits=False, reduction="none")
    clone = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(clone, MaskedSparseCategoricalCrossentropy)
    assert (clone.ignore_class, clone.label_smoothing, clone.from_logits, clone.reduction) == (
        -1, 0.1, False, "none")


# === Errors ===


def test_invalid_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="ignore_class.*Received: ignore_class='pad'"):
        MaskedSparseCategoricalCrossentropy(ignore_class="pad")
    with pytest.raises(ValueError, match="ignore_class.*Received: ignore_class=True"):
        MaskedSparseCategoricalCrossentropy(ignore_class=True)
    with pytest.raises(ValueError, match=r"label_smoothing.*\[0, 1\).*label_smoothing=1.0"):
        MaskedSparseCategoricalCrossentropy(label_smoothing=1.0)
    with pytest.raises(ValueError, match="reduction"):
        MaskedSparseCategoricalCrossentropy(reduction="average")
