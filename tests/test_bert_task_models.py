"""BERT task models: they learn (overfit a tiny batch), serialize, export; the pretraining
loss and the tied masked-LM output against numpy."""

import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_masked_lm import BertMaskedLM
from keras_attn.models.bert_pretrainer import BertPretrainer
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.models.masked_lm_head import MaskedLMHead
from keras_attn.models.masked_sparse_categorical_crossentropy import (
    MaskedSparseCategoricalCrossentropy,
)
from tests.numpy_reference import np_layer_norm

V, B, T = 30, 8, 6


def backbone(**kwargs):
    return BertBackbone(**{**dict(vocabulary_size=V, num_layers=1, num_heads=2, hidden_dim=16,
                                  intermediate_dim=32, max_sequence_length=12, dropout=0.0),
                           **kwargs})


def batch(seed=0):
    rng = np.random.default_rng(seed)
    padding = np.ones((B, T), "int32")
    padding[::2, T - 1] = 0
    return {
        "token_ids": (rng.integers(1, V, (B, T)) * padding).astype("int32"),
        "segment_ids": np.repeat([[0, 0, 0, 1, 1, 1]], B, 0).astype("int32"),
        "padding_mask": padding,
    }


def overfit(model, x, y, loss=None, epochs=15):
    model.compile(optimizer=keras.optimizers.Adam(3e-2), loss=loss)
    history = model.fit(x, y, batch_size=B, epochs=epochs, verbose=0).history["loss"]
    assert np.isfinite(history).all()
    assert history[-1] < history[0] / 10, history  # the tiny batch is memorized
    return history


def assert_same_outputs(a, b, atol=0.0):
    for got, want in zip(keras.tree.flatten(a), keras.tree.flatten(b)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=atol)


def check_serialization(model, x, tmp_path):
    config = model.get_config()
    clone = type(model).from_config(config)
    assert clone.get_config() == config
    assert clone.count_params() == model.count_params()
    expected = model.predict(x, verbose=0)
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert type(loaded) is type(model)
    assert_same_outputs(loaded.predict(x, verbose=0), expected)
    return loaded, expected


def check_export(model, x, expected, tmp_path):
    import tensorflow as tf

    path = os.path.join(tmp_path, "saved_model")
    model.export(path, format="tf_saved_model", verbose=0)
    reloaded = tf.saved_model.load(path)
    got = reloaded.serve({k: tf.constant(v) for k, v in x.items()})
    assert_same_outputs(keras.tree.map_structure(lambda t: t.numpy(), got), expected,
                        atol=1e-5)


tensorflow_only = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="SavedModel export of a Keras model needs the TensorFlow backend",
)


# === BertClassifier ===


def test_classifier_pools_cls_and_overfits(tmp_path):
    model = BertClassifier(backbone(), num_classes=3, dropout=0.0)
    x = batch()
    # logits = W pooled + b, exactly.
    pooled = ops.convert_to_numpy(model.backbone(x)["pooled_output"])
    dense = model.get_layer("logits")
    expected = pooled @ ops.convert_to_numpy(dense.kernel) + ops.convert_to_numpy(dense.bias)
    np.testing.assert_allclose(ops.convert_to_numpy(model(x)), expected, atol=1e-5)
    y = np.arange(B) % 3
    overfit(model, x, y, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert (model.predict(x, verbose=0).argmax(-1) == y).all()
    loaded, expected = check_serialization(model, x, tmp_path)
    if keras.backend.backend() == "tensorflow":
        check_export(model, x, expected, tmp_path)


def test_classifier_rejects_bad_arguments():
    with pytest.raises(ValueError, match="backbone.*BertBackbone"):
        BertClassifier(keras.Sequential([keras.layers.Dense(2)]), num_classes=2)
    with pytest.raises(ValueError, match="num_classes"):
        BertClassifier(backbone(), num_classes=0)


# === BertTokenClassifier ===


def token_labels(x, seed=1):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, (B, T))
    labels[:, 0] = -100  # [CLS]
    labels[:, 2] = -100  # a continuation word piece
    labels[x["padding_mask"] == 0] = -100
    return labels


def test_token_classifier_overfits_on_labelled_tokens(tmp_path):
    model = BertTokenClassifier(backbone(), num_labels=4, dropout=0.0)
    x = batch()
    y = token_labels(x)
    overfit(model, x, y, MaskedSparseCategoricalCrossentropy())
    predicted = model.predict(x, verbose=0).argmax(-1)
    assert (predicted[y != -100] == y[y != -100]).all()
    check_serialization(model, x, tmp_path)


def test_token_classifier_with_crf(tmp_path):
    model = BertTokenClassifier(backbone(), num_labels=4, dropout=0.0, use_crf=True)
    x = batch()
    y = token_labels(x)
    x["label_mask"] = (y != -100).astype("int32")
    # The built-in loss is the CRF's mean negative log-likelihood over labelled tokens.
    logits = model(x)["logits"]
    labelled = y != -100
    expected = -np.mean(ops.convert_to_numpy(
        model.crf.log_likelihood(logits, np.where(labelled, y, 0), mask=labelled)))
    y_pred = model(x)
    assert float(model.compute_loss(x, y, y_pred)) == pytest.approx(expected, rel=1e-5)
    overfit(model, x, y)
    tags = model.predict(x, verbose=0)["tags"]
    assert tags.dtype == np.int32
    assert (tags[labelled] == y[labelled]).all() and (tags[~labelled] == 0).all()
    loaded, expected = check_serialization(model, x, tmp_path)
    if keras.backend.backend() == "tensorflow":
        check_export(model, x, expected, tmp_path)
    with pytest.raises(ValueError, match="CRF loss.*labels"):
        model.compute_loss(x, {"labels": y}, y_pred)


# === Masked LM ===


def backbone_inputs(x):
    return {k: x[k] for k in ("token_ids", "segment_ids", "padding_mask")}


def numpy_masked_lm(model, x):
    head = model.masked_lm_head
    sequence = ops.convert_to_numpy(model.backbone(backbone_inputs(x))["sequence_output"])
    gathered = np.take_along_axis(sequence, x["mask_positions"][:, :, None], axis=1)
    kernel, bias = (ops.convert_to_numpy(w) for w in head.transform_dense.weights)
    u = gathered @ kernel + bias
    u = np_layer_norm(0.5 * u * (1 + np.vectorize(__import__("math").erf)(u / 2**0.5)),
                      head.transform_layer_norm)
    table = ops.convert_to_numpy(model.backbone.token_embedding.embeddings)
    return u @ table.T + ops.convert_to_numpy(head.output_bias)


def test_masked_lm_output_is_tied_to_token_embedding(tmp_path):
    model = BertMaskedLM(backbone())
    x = dict(batch(), mask_positions=np.tile([[1, 4]], (B, 1)).astype("int32"))
    embedding = model.backbone.token_embedding.embeddings
    assert model.masked_lm_head.token_embedding.embeddings is embedding
    # One (V, H) table in the model: the head adds only transform + LayerNorm + bias.
    H = 16
    assert model.count_params() - model.backbone.count_params() == H * H + H + 2 * H + V
    assert sum(w is embedding for w in model.trainable_weights) == 1
    np.testing.assert_allclose(ops.convert_to_numpy(model(x)), numpy_masked_lm(model, x),
                               atol=1e-4)
    # Writing the shared variable changes the logits as the formula says.
    embedding.assign(embedding * 2.0)
    np.testing.assert_allclose(ops.convert_to_numpy(model(x)), numpy_masked_lm(model, x),
                               atol=1e-4)
    loaded, _ = check_serialization(model, x, tmp_path)
    assert loaded.masked_lm_head.token_embedding.embeddings is \
        loaded.backbone.token_embedding.embeddings


def test_masked_lm_overfits():
    model = BertMaskedLM(backbone())
    x = dict(batch(), mask_positions=np.tile([[1, 4]], (B, 1)).astype("int32"))
    y = np.random.default_rng(2).integers(0, V, (B, 2))
    y[0, 1] = -100  # an unused mask slot
    overfit(model, x, y, MaskedSparseCategoricalCrossentropy(), epochs=30)


def test_masked_lm_head_errors():
    with pytest.raises(ValueError, match="token_embedding.*vocabulary_size"):
        MaskedLMHead()
    embedding = keras.layers.Embedding(20, 8)
    embedding.build((None, None))
    with pytest.raises(ValueError, match="vocabulary_size=21"):
        MaskedLMHead(token_embedding=embedding, vocabulary_size=21)
    with pytest.raises(ValueError, match="width must equal its H=8"):
        MaskedLMHead(token_embedding=embedding)(np.ones((1, 3, 6)), np.zeros((1, 1), "int32"))
    untied = MaskedLMHead(vocabulary_size=20)
    assert tuple(untied(np.ones((1, 3, 6)), np.zeros((1, 2), "int32")).shape) == (1, 2, 20)


# === BertPretrainer ===


def pretraining_batch():
    x = dict(batch(), mask_positions=np.tile([[1, 4, 0]], (B, 1)).astype("int32"))
    rng = np.random.default_rng(3)
    y = {
        "mask_ids": rng.integers(0, V, (B, 3)),
        "mask_weights": np.tile([[1.0, 1.0, 0.0]], (B, 1)).astype("float32"),
        "next_sentence_labels": np.arange(B) % 2,
    }
    return x, y


def test_pretrainer_loss_is_weighted_mlm_plus_nsp():
    model = BertPretrainer(backbone())
    x, y = pretraining_batch()
    y_pred = model(x)
    mlm = ops.convert_to_numpy(y_pred["mlm_logits"]).astype("float64")
    nsp = ops.convert_to_numpy(y_pred["nsp_logits"]).astype("float64")

    def ce(logits, labels):
        log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        return -np.take_along_axis(log_p, labels[..., None], -1)[..., 0]

    w = y["mask_weights"]
    expected = (ce(mlm, y["mask_ids"]) * w).sum() / w.sum() \
        + ce(nsp, y["next_sentence_labels"]).mean()
    assert float(model.compute_loss(x, y, y_pred)) == pytest.approx(expected, rel=1e-5)
    # The NSP head reads the pooled [CLS] state.
    pooled = ops.convert_to_numpy(model.backbone(backbone_inputs(x))["pooled_output"])
    kernel, bias = (ops.convert_to_numpy(v) for v in model.next_sentence_head.weights)
    np.testing.assert_allclose(nsp, pooled @ kernel + bias, atol=1e-5)
    with pytest.raises(ValueError, match="mask_weights.*Received: y=\\['mask_ids'"):
        model.compute_loss(x, {"mask_ids": y["mask_ids"]}, y_pred)
    # The training pipeline's per-term weights (normalized over a global batch that this
    # batch is half of) give the weighted sums: two halves add up to the global loss.
    half = {"mlm": w / (2 * w.sum()), "nsp": np.full(B, 1 / (2 * B), "float32")}
    weighted = float(model.compute_loss(x, y, y_pred, sample_weight=half))
    assert 2 * weighted == pytest.approx(expected, rel=1e-5)


def test_pretrainer_overfits_and_serializes(tmp_path):
    model = BertPretrainer(backbone())
    x, y = pretraining_batch()
    overfit(model, x, y, epochs=30)
    out = model.predict(x, verbose=0)
    assert (out["nsp_logits"].argmax(-1) == y["next_sentence_labels"]).all()
    assert (out["mlm_logits"][:, :2].argmax(-1) == y["mask_ids"][:, :2]).all()
    loaded, _ = check_serialization(model, x, tmp_path)
    assert loaded.masked_lm_head.token_embedding.embeddings is \
        loaded.backbone.token_embedding.embeddings


def test_from_preset_builds_task_models():
    classifier = BertClassifier.from_preset("bert_tiny", num_classes=2, max_sequence_length=32)
    assert classifier.backbone.hidden_dim == 128
    assert classifier.count_params() == classifier.backbone.count_params() + 128 * 2 + 2
