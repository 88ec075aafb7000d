"""XLNet models: they learn (overfit a tiny batch), serialize to `.keras`, export a
SavedModel; the published XLNet-Base parameter count."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.models.permutation_lm_inputs import permutation_lm_inputs
from keras_attn.models.xlnet_backbone import XLNET_PRESETS
from keras_attn.models.xlnet_backbone import XLNetBackbone
from keras_attn.models.xlnet_backbone import xlnet_parameter_count
from keras_attn.models.xlnet_classifier import XLNetClassifier
from keras_attn.models.xlnet_lm import XLNetLM
from keras_attn.models.xlnet_token_classifier import XLNetTokenClassifier
from tests.test_bert_task_models import check_export
from tests.test_bert_task_models import check_serialization
from tests.test_bert_task_models import overfit

V, B, T = 30, 8, 6


def backbone(**kwargs):
    return XLNetBackbone(**{**dict(vocabulary_size=V, num_layers=1, num_heads=2,
                                   hidden_dim=16, intermediate_dim=32, dropout=0.0),
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


def test_lm_overfits_serializes_and_exports(tmp_path):
    model = XLNetLM(backbone(two_stream=True))
    x = batch()
    inputs, labels, weights = permutation_lm_inputs(
        x["token_ids"], 2, padding_mask=x["padding_mask"], seed=0)
    inputs = {k: ops.convert_to_numpy(v) for k, v in inputs.items()}
    # Tied output: logits = g W_emb^T + b.
    query = ops.convert_to_numpy(model.backbone(inputs)["query_output"])
    embedding = ops.convert_to_numpy(model.backbone.token_embedding.embeddings)
    bias = ops.convert_to_numpy(model.get_layer("lm_bias").bias)
    np.testing.assert_allclose(ops.convert_to_numpy(model(inputs)),
                               query @ embedding.T + bias, atol=1e-5)
    model.compile(optimizer=keras.optimizers.Adam(3e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(inputs, ops.convert_to_numpy(labels),
                        sample_weight=ops.convert_to_numpy(weights), batch_size=B,
                        epochs=25, verbose=0).history["loss"]
    assert history[-1] < history[0] / 3, history  # the tiny batch is being memorized
    loaded, expected = check_serialization(model, inputs, tmp_path)
    if keras.backend.backend() == "tensorflow":
        check_export(model, inputs, expected, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("head", [XLNetClassifier, XLNetTokenClassifier])
def test_heads_fine_tune_a_pretrained_encoder(head, tmp_path):
    pretrained = backbone(two_stream=True)
    encoder = pretrained.content_stream_backbone()
    np.testing.assert_array_equal(
        ops.convert_to_numpy(encoder.get_layer("xlnet_layer_0").weights[0]),
        ops.convert_to_numpy(pretrained.get_layer("xlnet_layer_0").weights[0]))
    model = head(encoder, num_classes=3, dropout=0.0)
    x = batch()
    y = np.arange(B) % 3 if head is XLNetClassifier else np.arange(B * T).reshape(B, T) % 3
    overfit(model, x, y, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            epochs=40)
    assert (model.predict(x, verbose=0).argmax(-1) == y).mean() > 0.9
    loaded, expected = check_serialization(model, x, tmp_path)
    if keras.backend.backend() == "tensorflow":
        check_export(model, x, expected, tmp_path)


def test_classifier_summarizes_the_last_real_token():
    model = XLNetClassifier(backbone(), num_classes=2, dropout=0.0)
    x = batch()
    h = ops.convert_to_numpy(model.backbone(x)["sequence_output"])
    last = x["padding_mask"].sum(1) - 1
    summary = model.get_layer("summary")
    s = np.tanh(h[np.arange(B), last] @ ops.convert_to_numpy(summary.kernel)
                + ops.convert_to_numpy(summary.bias))
    dense = model.get_layer("logits")
    np.testing.assert_allclose(
        ops.convert_to_numpy(model(x)),
        s @ ops.convert_to_numpy(dense.kernel) + ops.convert_to_numpy(dense.bias), atol=1e-5)


def test_bad_backbones_are_named():
    with pytest.raises(ValueError, match="two_stream=True"):
        XLNetLM(backbone())
    with pytest.raises(ValueError, match="two_stream=False"):
        XLNetClassifier(backbone(two_stream=True), num_classes=2)
    with pytest.raises(ValueError, match="hidden_dim"):
        backbone(hidden_dim=15, num_heads=3)


@pytest.mark.slow
def test_xlnet_base_cased_has_the_published_parameter_count():
    # transformers' XLNetModel(xlnet-base-cased config): 116,718,336 parameters.
    model = XLNetBackbone.from_preset("xlnet_base_cased", two_stream=True)
    assert model.count_params() == 116_718_336
    assert xlnet_parameter_count(**XLNET_PRESETS["xlnet_base_cased"]) == 116_718_336
