"""`quantization_sensitivity`: the int8 error each op of a calibrated twin adds alone."""

import keras
import numpy as np
import pytest

from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.quantization_sensitivity import quantization_sensitivity
from tests.quantized_bert import quantized_bert

pytestmark = pytest.mark.tensorflow


def _calibrated(num_outputs=3, **kwargs):
    keras.utils.set_random_seed(0)
    qat = quantized_bert(vocabulary_size=40, num_layers=2, num_heads=2, hidden_dim=16,
                         intermediate_dim=32, max_sequence_length=12, num_outputs=num_outputs,
                         float_residual=True, **kwargs)
    logits = qat.get_layer("logits")
    logits.kernel.assign(logits.kernel.numpy() * 50)  # trained-like logit scale
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(3):
        mask = (np.arange(10)[None] < rng.integers(4, 11, (4, 1))).astype("int32")
        batches.append({"token_ids": rng.integers(4, 40, (4, 10)).astype("int32") * mask,
                        "segment_ids": np.zeros((4, 10), "int32"), "padding_mask": mask})
    qat.calibrate(batches)
    return qat, batches


def _snr(out, ref):
    return 10 * np.log10((ref ** 2).sum() / ((out - ref) ** 2).sum())


def test_rows_match_the_twins_they_stand_for():
    qat, batches = _calibrated()
    rows = quantization_sensitivity(qat, batches)
    # "all" is the recipe (ranges frozen) against its float twin, by the formula.
    qat.freeze_ranges()
    quantized = np.concatenate([np.asarray(qat(x, training=False)) for x in batches])
    float_twin = qat.with_quantization(False)
    reference = np.concatenate([np.asarray(float_twin(x, training=False)) for x in batches])
    quantized = quantized.astype("float64")
    all_row = rows[0]
    assert all_row["op"] == "all"
    assert all_row["snr_db"] == pytest.approx(_snr(quantized, reference), abs=0.05)
    assert all_row["max_abs_logit_diff"] == pytest.approx(np.abs(quantized - reference).max(),
                                                          abs=1e-4)
    assert all_row["agreement"] == np.mean(quantized.argmax(-1) == reference.argmax(-1))
    # One row per op, sorted from the lowest SNR; each op alone errs less than all.
    assert sorted(row["op"] for row in rows[1:]) == sorted(qat.quantization_ops())
    snrs = [row["snr_db"] for row in rows[1:]]
    assert snrs == sorted(snrs) and min(snrs) >= all_row["snr_db"] - 0.5
    # A row is the model with every other op float (`with_float_ops`), by the formula.
    op = rows[1]["op"]
    alone = qat.with_float_ops([name for name in qat.quantization_ops() if name != op])
    alone.freeze_ranges()
    out = np.concatenate([np.asarray(alone(x, training=False)) for x in batches])
    assert rows[1]["snr_db"] == pytest.approx(_snr(out.astype("float64"), reference), abs=0.05)
    # Every op float: the float model but for the rounding of the embeddings' LayerNorm
    # output, which no op of the budget names (a gap: it should follow its reader's choice).
    every = qat.with_float_ops(qat.quantization_ops())
    rounding = [q.path for q in activation_quantizers(every.model) if q.quantize]
    assert rounding == ["embeddings_layer_norm_output_quantizer"], rounding
    out = np.concatenate([np.asarray(every(x, training=False)) for x in batches])
    assert _snr(out.astype("float64"), reference) > rows[0]["snr_db"] + 5


def test_ops_the_recipe_keeps_float_get_no_row():
    qat, batches = _calibrated()
    partial = qat.with_float_ops(["transformer_layer_0/intermediate", "logits"])
    ops = [row["op"] for row in quantization_sensitivity(partial, batches)[1:]]
    assert sorted(ops) == sorted(set(qat.quantization_ops())
                                 - {"transformer_layer_0/intermediate", "logits"})


def test_an_op_with_a_bad_range_is_named_first():
    qat, batches = _calibrated()
    # Squeeze the pooler's (tanh) output range to a tenth: that op alone now clips hard.
    quantizer = qat.get_layer("pooled_dense").activation_quantizer
    quantizer.min_value.assign(quantizer.min_value.numpy() / 10)
    quantizer.max_value.assign(quantizer.max_value.numpy() / 10)
    rows = quantization_sensitivity(qat, batches)
    assert rows[1]["op"] == "pooled_dense", rows
    assert rows[1]["snr_db"] < rows[2]["snr_db"] - 3


@pytest.mark.slow  # 10-20 s on 2 cores: the slow stage keeps make test within 15 min
def test_a_tagger_compares_real_tokens_only():
    qat, batches = _calibrated(num_outputs=5, head="token_classification")
    rows = quantization_sensitivity(qat, batches)
    real = sum(int(x["padding_mask"].sum()) for x in batches)
    for row in rows:  # agreement counts the 26 real tokens, not the 40 positions
        assert row["agreement"] * real == pytest.approx(round(row["agreement"] * real))
    # Padded positions carry no weight: changing their ids changes no row.
    padded = [dict(x, token_ids=np.where(x["padding_mask"] == 1, x["token_ids"], 7))
              for x in batches]
    assert quantization_sensitivity(qat, padded) == rows
