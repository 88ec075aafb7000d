import keras
import numpy as np
import pytest

from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.quantization.qat_bert import QatBert

# QatBert passes Keras variables to ops in ways JAX rejects; TensorFlow only for now.
pytestmark = pytest.mark.tensorflow

VOCAB, LENGTH = 60, 12


def tiny_backbone(**kwargs):
    return BertBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
                        intermediate_dim=32, max_sequence_length=16, **kwargs)


def batch(seed, size=4):
    rng = np.random.default_rng(seed)
    mask = np.ones((size, LENGTH), "int32")
    for b, length in enumerate(rng.integers(2, LENGTH + 1, size)):
        mask[b, length:] = 0
    return {
        "token_ids": (rng.integers(1, VOCAB, (size, LENGTH)) * mask).astype("int32"),
        "segment_ids": (rng.random((size, LENGTH)) > 0.5).astype("int32"),
        "padding_mask": mask,
    }


def numpy_logits(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


@pytest.mark.parametrize("fused_qkv", [True, False])
@pytest.mark.parametrize("head", ["classification", "token_classification"])
def test_quantization_off_equals_float_model(head, fused_qkv):
    backbone = tiny_backbone(fused_qkv=fused_qkv)
    model = (BertClassifier(backbone, num_classes=3) if head == "classification"
             else BertTokenClassifier(backbone, num_labels=5))
    qat = QatBert.from_float(model, quantize=False)
    x = batch(1)
    assert x["padding_mask"].min() == 0  # padding is exercised
    np.testing.assert_allclose(numpy_logits(qat, x), numpy_logits(model, x), atol=1e-5)


def test_quantization_on_stays_within_quantization_error():
    keras.utils.set_random_seed(0)
    model = BertTokenClassifier(tiny_backbone(), num_labels=5)
    # Trained-like scale: logits of order 1 (BERT's 0.02 init gives ~0.01 logits).
    for layer in (model.get_layer("logits"),):
        layer.kernel.assign(layer.kernel.numpy() * 50)
    qat = QatBert.from_float(model)
    qat.calibrate([batch(seed) for seed in range(2, 6)])
    x = batch(1)
    reference, quantized = numpy_logits(model, x), numpy_logits(qat, x)
    real = x["padding_mask"].astype(bool)
    error = np.abs(quantized - reference)[real]
    spread = reference[real].max() - reference[real].min()
    # 8-bit activations and weights through 2 blocks: a few quantization steps of the
    # logit range, far from the float logits being ignored (error ~ spread).
    assert error.max() < 0.1 * spread
    assert (quantized.argmax(-1) == reference.argmax(-1))[real].mean() >= 0.9


def test_weights_round_trip_exactly():
    model = BertClassifier(tiny_backbone(), num_classes=3)
    qat = QatBert.from_float(model)
    back = qat.to_float()
    for a, b in zip(model.get_weights(), back.get_weights()):
        np.testing.assert_array_equal(a, b)
    # Writing into an existing float model too.
    other = BertClassifier(tiny_backbone(), num_classes=3)
    qat.to_float(other)
    for a, b in zip(model.get_weights(), other.get_weights()):
        np.testing.assert_array_equal(a, b)


def crf_tagger(seed=0):
    """A tiny CRF tagger with trained-like scales: logits of order 1 (BERT's 0.02 init
    gives ~0.01 logits) and transitions of the same order, so both decide the tags."""
    keras.utils.set_random_seed(seed)
    tagger = BertTokenClassifier(tiny_backbone(), num_labels=4, use_crf=True)
    logits = tagger.get_layer("logits")
    logits.kernel.assign(logits.kernel.numpy() * 50)
    rng = np.random.default_rng(seed)
    for variable in (tagger.crf.transitions, tagger.crf.start_transitions,
                     tagger.crf.end_transitions):
        variable.assign(rng.normal(size=variable.shape).astype("float32"))
    return tagger


def crf_batch(seed):
    """`batch(seed)` with a `label_mask` that skips some real tokens (the non-first word
    pieces), unlike the padding mask."""
    x = batch(seed)
    x["label_mask"] = x["padding_mask"].copy()
    x["label_mask"][:, 0] = 0  # [CLS]
    x["label_mask"][:, 2::3] = 0
    return x


def crf_outputs(model, x):
    return {k: keras.ops.convert_to_numpy(v) for k, v in model(x, training=False).items()}


def test_crf_tagger_twin_equals_float_model():
    tagger = crf_tagger()
    qat = QatBert.from_float(tagger, quantize=False)
    assert qat.use_crf and [i.name for i in qat.inputs] == [i.name for i in tagger.inputs]
    for name in ("transitions", "start_transitions", "end_transitions"):
        np.testing.assert_array_equal(getattr(qat.crf, name).numpy(),
                                      getattr(tagger.crf, name).numpy())
    x = crf_batch(3)
    outputs, reference = crf_outputs(qat, x), crf_outputs(tagger, x)
    assert sorted(outputs) == ["logits", "tags"]
    np.testing.assert_allclose(outputs["logits"], reference["logits"], atol=1e-5)
    np.testing.assert_array_equal(outputs["tags"], reference["tags"])
    # The tags follow the label mask (0 elsewhere), as the float tagger's do.
    assert not outputs["tags"][x["label_mask"] == 0].any()
    assert outputs["tags"][x["label_mask"] == 1].any()


def test_crf_tagger_calibrated_stays_within_quantization_error():
    tagger = crf_tagger()
    qat = QatBert.from_float(tagger, float_residual=True, feedforward_float_channels=4)
    # Batches without `label_mask` decode over the padding mask.
    qat.calibrate([batch(seed) for seed in range(2, 6)])
    assert not qat.uncalibrated_quantizers()
    x = crf_batch(1)
    outputs, reference = crf_outputs(qat, x), crf_outputs(tagger, x)
    real = x["padding_mask"].astype(bool)
    error = np.abs(outputs["logits"] - reference["logits"])[real]
    spread = reference["logits"][real].max() - reference["logits"][real].min()
    # The tolerance of the softmax tagger's test above: a few int8 steps of the range.
    assert error.max() < 0.1 * spread
    labelled = x["label_mask"].astype(bool)
    assert (outputs["tags"] == reference["tags"])[labelled].mean() >= 0.9


def test_crf_emissions_model_is_the_network_without_the_crf(tmp_path):
    qat = QatBert.from_float(crf_tagger())
    qat.calibrate([crf_batch(seed) for seed in range(2, 4)])
    emissions = qat.emissions_model()
    assert not emissions.use_crf and "crf" not in [layer.name for layer in emissions.layers]
    assert sorted(i.name for i in emissions.inputs) == ["padding_mask", "segment_ids",
                                                        "token_ids"]
    assert not emissions.uncalibrated_quantizers()
    x = crf_batch(4)
    logits = crf_outputs(qat, x)["logits"]
    three = {k: v for k, v in x.items() if k != "label_mask"}
    np.testing.assert_array_equal(numpy_logits(emissions, three), logits)
    assert QatBert.from_float(BertClassifier(tiny_backbone(), 2)).emissions_model().head \
        == "classification"
    # Saved and loaded with its CRF; written back into a float CRF tagger exactly.
    path = str(tmp_path / "qat_crf.keras")
    qat.save(path)
    loaded = keras.saving.load_model(path)
    for name, value in crf_outputs(loaded, x).items():
        np.testing.assert_array_equal(value, crf_outputs(qat, x)[name])
    back, twin = qat.to_float(), qat.with_quantization(False)
    assert back.use_crf
    np.testing.assert_array_equal(back.crf.transitions.numpy(), qat.crf.transitions.numpy())
    float_outputs, twin_outputs = crf_outputs(back, x), crf_outputs(twin, x)
    np.testing.assert_allclose(float_outputs["logits"], twin_outputs["logits"], atol=1e-5)
    np.testing.assert_array_equal(float_outputs["tags"], twin_outputs["tags"])


@pytest.mark.slow  # 10-30 s on 2 cores: the slow stage keeps make test within 15 min
def test_crf_twin_trains_with_the_float_taggers_crf_loss():
    tagger = crf_tagger()
    qat = QatBert.from_float(tagger, quantize=False)
    x = crf_batch(3)
    labels = np.where(x["label_mask"] == 1, np.arange(LENGTH) % 4, -100).astype("int32")
    losses = [float(model.compute_loss(x=x, y=labels, y_pred=model(x, training=False)))
              for model in (qat, tagger)]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    # fit through the CRF loss moves the transitions (quantized twin, calibrated).
    quantized = QatBert.from_float(tagger)
    quantized.calibrate([x])
    quantized.compile(keras.optimizers.Adam(1e-2))
    history = quantized.fit(x, labels, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert not np.allclose(quantized.crf.transitions.numpy(), tagger.crf.transitions.numpy())


def test_crf_emission_network_only_on_request():
    tagger = crf_tagger()
    qat = QatBert.from_float(tagger, quantize=False, use_crf=False)
    x = crf_batch(3)
    np.testing.assert_allclose(numpy_logits(qat, {k: v for k, v in x.items()
                                                  if k != "label_mask"}),
                               crf_outputs(tagger, x)["logits"], atol=1e-5)


def test_fit_updates_ranges_and_weights_and_save_load(tmp_path):
    keras.utils.set_random_seed(1)
    model = BertClassifier(tiny_backbone(), num_classes=3)
    qat = QatBert.from_float(model)
    assert qat.uncalibrated_quantizers()
    qat.compile(keras.optimizers.Adam(1e-3),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = batch(4, size=8)
    y = np.arange(8) % 3
    kernel_before = qat.get_layer("logits").kernel.numpy().copy()
    history = qat.fit(x, y, epochs=3, batch_size=4, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert not qat.uncalibrated_quantizers()
    assert not np.array_equal(qat.get_layer("logits").kernel.numpy(), kernel_before)
    ranges = [(q.path, float(q.min_value.numpy()), float(q.max_value.numpy()))
              for q in qat.activation_quantizers]
    assert all(high > low for _, low, high in ranges)
    path = str(tmp_path / "qat.keras")
    qat.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(numpy_logits(loaded, x), numpy_logits(qat, x), atol=1e-6)
    # The quantization switch keeps weights and ranges.
    twin = qat.with_quantization(False)
    np.testing.assert_allclose(numpy_logits(twin, x), numpy_logits(qat.to_float(), x),
                               atol=1e-5)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="BertClassifier or a BertTokenClassifier"):
        QatBert.from_float(tiny_backbone())
    classifier = BertClassifier(tiny_backbone(), num_classes=2)
    tagger = BertTokenClassifier(tiny_backbone(), num_labels=2)
    with pytest.raises(ValueError, match="writes into a BertClassifier"):
        QatBert.from_float(classifier).to_float(tagger)
    with pytest.raises(ValueError, match="head"):
        QatBert(VOCAB, 1, 2, 16, 32, num_outputs=2, head="regression")
    with pytest.raises(ValueError, match="weight_quantization"):
        QatBert.from_float(classifier, weight_quantization="per_row")
    with pytest.raises(ValueError, match="at least one batch"):
        QatBert.from_float(classifier).calibrate([])
    with pytest.raises(ValueError, match="head='token_classification'"):
        QatBert(VOCAB, 1, 2, 16, 32, num_outputs=2, use_crf=True)
    with pytest.raises(ValueError, match="needs a tagger with a CRF"):
        QatBert.from_float(tagger, use_crf=True)
    with pytest.raises(ValueError, match="same `use_crf`"):
        QatBert.from_float(tagger).to_float(
            BertTokenClassifier(tiny_backbone(), num_labels=2, use_crf=True))


def test_layout_differences_list_what_differs():
    classifier = BertClassifier(tiny_backbone(), num_classes=2)
    qat = QatBert.from_float(classifier, float_residual=True, feedforward_float_channels=4)
    assert qat.layout_differences(True, 4) == []
    assert qat.layout_differences(False, 0) == [("float_residual", True, False),
                                                ("feedforward_float_channels", 4, 0)]
    assert qat.layout_differences(True, 2) == [("feedforward_float_channels", 4, 2)]


@pytest.mark.parametrize("quantize", [False, True])
def test_block_query_length_equals_the_first_rows(quantize):
    from keras_attn.quantization.qat_encoder_block import QatEncoderBlock

    keras.utils.set_random_seed(1)
    block = QatEncoderBlock(num_heads=2, intermediate_dim=32, quantize=quantize, decay=0.5)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, LENGTH, 16)).astype("float32")
    mask = batch(3, size=3)["padding_mask"]
    for _ in range(3):  # EMA ranges from the full rows
        block(x, padding_mask=mask, training=True)
    full = keras.ops.convert_to_numpy(block(x, padding_mask=mask))
    for q in (1, 2):
        rows = keras.ops.convert_to_numpy(block(x, padding_mask=mask, query_length=q))
        assert rows.shape == (3, q, 16)
        np.testing.assert_allclose(rows, full[:, :q], atol=1e-5)


def test_block_query_length_must_be_a_positive_int():
    from keras_attn.quantization.qat_encoder_block import QatEncoderBlock

    block = QatEncoderBlock(num_heads=2, intermediate_dim=32, quantize=False)
    x, mask = np.zeros((1, LENGTH, 16), "float32"), np.ones((1, LENGTH), "int32")
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=f"query_length={bad}"):
            block(x, padding_mask=mask, query_length=bad)
    with pytest.raises(ValueError, match=f"at most the sequence length T={LENGTH}"):
        block(x, padding_mask=mask, query_length=LENGTH + 1)
