"""`quantization_sensitivity`: the int8 error each group of a calibrated twin adds alone."""

import numpy as np
import pytest

from keras_attn.quantization.qat_bert import QatBert
from keras_attn.quantization.quantization_sensitivity import quantization_groups
from keras_attn.quantization.quantization_sensitivity import quantization_sensitivity

pytestmark = pytest.mark.tensorflow


def _calibrated(num_outputs=3, **kwargs):
    qat = QatBert(vocabulary_size=40, num_layers=3, num_heads=2, hidden_dim=16,
                  intermediate_dim=32, max_sequence_length=12, num_outputs=num_outputs,
                  float_residual=True, **kwargs)
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


def test_rows_match_the_twins_they_stand_for_and_flags_are_restored():
    qat, batches = _calibrated()
    before = [np.asarray(qat(x, training=False)) for x in batches]
    rows = quantization_sensitivity(qat, batches)
    # The model is left as it was (the recipe's flags).
    after = [np.asarray(qat(x, training=False)) for x in batches]
    np.testing.assert_array_equal(np.concatenate(before), np.concatenate(after))
    # "all" is the recipe against its float twin (`with_quantization(False)`), by the formula.
    float_twin = qat.with_quantization(False)
    reference = np.concatenate([np.asarray(float_twin(x, training=False)) for x in batches])
    quantized = np.concatenate(before).astype("float64")
    all_row = rows[0]
    assert all_row["group"] == "all"
    assert all_row["snr_db"] == pytest.approx(_snr(quantized, reference), abs=0.05)
    assert all_row["max_abs_logit_diff"] == pytest.approx(np.abs(quantized - reference).max(),
                                                          abs=1e-4)
    assert all_row["agreement"] == np.mean(quantized.argmax(-1) == reference.argmax(-1))
    # One row per group, sorted from the lowest SNR; each group alone errs less than all.
    groups = [row["group"] for row in rows[1:]]
    assert sorted(groups) == sorted(quantization_groups(qat))
    snrs = [row["snr_db"] for row in rows[1:]]
    assert snrs == sorted(snrs) and min(snrs) >= all_row["snr_db"] - 0.5


def test_a_group_with_a_bad_range_is_named_first():
    qat, batches = _calibrated()
    # Squeeze one activation range of block 1 to a tenth: that block alone now clips hard.
    quantizer = qat.get_layer("transformer_layer_1").quantizers["qkv_quantizer"]
    quantizer.min_value.assign(quantizer.min_value.numpy() / 10)
    quantizer.max_value.assign(quantizer.max_value.numpy() / 10)
    rows = quantization_sensitivity(qat, batches)
    assert rows[1]["group"] == "transformer_layer_1", rows
    assert rows[1]["snr_db"] < rows[2]["snr_db"] - 3


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
