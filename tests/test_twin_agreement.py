"""`twin_agreement`: per-output argmax agreement and |Δlogit| in int8 steps, checked on
outputs whose differences are written by hand."""

import numpy as np
import pytest

from keras_attn.export.twin_agreement import agreement_row
from keras_attn.export.twin_agreement import twin_agreement
from keras_attn.export.twin_agreement import twin_agreement_markdown

STEP = 0.25


def test_a_classifier_counts_examples_and_steps():
    reference = [np.array([1.0, 0.0]), np.array([0.0, 2.0]), np.array([3.0, 1.0]),
                 np.array([0.5, 0.25])]
    # Off by 0, 1, 2 steps; the last flips its argmax with a 1-step change of each logit.
    outputs = [np.array([1.0, 0.0]), np.array([0.25, 2.0]), np.array([3.0, 1.5]),
               np.array([0.25, 0.5])]
    row = agreement_row(outputs, reference, STEP)
    assert row["outputs"] == 4 and row["disagreements"] == 1 and row["agreement"] == 0.75
    assert row["steps_max"] == 2.0 and row["steps_median"] == 1.0
    assert row["steps_p99"] == pytest.approx(1.97)  # numpy's linear interpolation of 1, 2
    assert row["max_abs_logit_diff"] == 0.5


def test_a_tagger_counts_real_tokens():
    # Two sentences of 3 and 1 real tokens (per-example arrays of (n, C) logits).
    reference = [np.zeros((3, 2)) + [1.0, 0.0], np.array([[0.0, 1.0]])]
    outputs = [reference[0].copy(), np.array([[1.0, 0.5]])]
    outputs[0][1] = [1.0, 3 * STEP]
    row = agreement_row(outputs, reference, STEP)
    assert row["outputs"] == 4 and row["disagreements"] == 1
    # Steps per token: 0, 3, 0 and 4 (the flipped one).
    assert row["steps_median"] == 1.5 and row["steps_max"] == 4.0


def test_the_section_and_its_page():
    twin = [np.array([1.0, 0.0]), np.array([0.0, 1.0])]
    xnnpack = [np.array([1.0, 0.25]), np.array([0.0, 1.0])]
    builtin = [np.array([1.0, 0.0]), np.array([1.0, 0.0])]
    section = twin_agreement(twin, xnnpack, builtin, STEP)
    assert section["logit_step"] == STEP
    assert section["twin_vs_file"]["disagreements"] == 0
    assert section["twin_vs_builtin_kernels"]["disagreements"] == 1
    assert section["builtin_kernels_vs_file"]["steps_max"] == 4.0
    page = "\n".join(twin_agreement_markdown(section))
    assert "## The calibrated model vs its file" in page and "one step = 0.25" in page
    assert "| Keras model vs file (XNNPACK, as shipped) | 1.0000 | 0 of 2 | 0.5 / 1.0 / 1.0 |" \
        in page
    assert "| file: builtin kernels vs XNNPACK | 0.5000 | 1 of 2 | 2.5 / 4.0 / 4.0 |" in page
    assert twin_agreement_markdown(None) == []
