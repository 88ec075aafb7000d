"""Every model round-trips through `.keras` (safe mode) and `model.export()` SavedModel.

One tiny instance of each task model, the same checks for all: the reloaded `.keras` model
and the reloaded SavedModel's `serve` endpoint give the outputs of the original.
"""

import keras
import numpy as np
import pytest

from keras_attn.models import BertBackbone
from keras_attn.models import BertClassifier
from keras_attn.models import BertMaskedLM
from keras_attn.models import BertPretrainer
from keras_attn.models import BertTokenClassifier
from keras_attn.models import GPTBackbone
from keras_attn.models import GPTCausalLM
from keras_attn.models import Seq2SeqTransformer
from keras_attn.models import TransformerXLLM
from tests.tolerances import float32_path_atol

B, T, V = 2, 6, 50
RNG = np.random.default_rng(0)
IDS = RNG.integers(1, V, size=(B, T)).astype("int32")
PADDING = np.array([[1] * T, [1] * 4 + [0] * 2], "int32")
BERT_INPUTS = {"token_ids": IDS, "segment_ids": np.zeros_like(IDS), "padding_mask": PADDING}


def bert():
    return BertBackbone(vocabulary_size=V, num_layers=1, num_heads=2, hidden_dim=8,
                        intermediate_dim=16, max_sequence_length=T)


def gpt():
    return GPTBackbone(vocabulary_size=V, num_layers=1, num_heads=2, hidden_dim=8,
                       intermediate_dim=16, max_sequence_length=T)


CASES = {
    "bert_token_classifier": (lambda: BertTokenClassifier(bert(), num_labels=5), BERT_INPUTS),
    "bert_token_classifier_crf": (
        lambda: BertTokenClassifier(bert(), num_labels=5, use_crf=True),
        {**BERT_INPUTS, "label_mask": PADDING},
    ),
    "bert_classifier": (lambda: BertClassifier(bert(), num_classes=3), BERT_INPUTS),
    "bert_masked_lm": (
        lambda: BertMaskedLM(bert()),
        {**BERT_INPUTS, "mask_positions": np.array([[1, 2], [0, 3]], "int32")},
    ),
    "bert_pretrainer": (
        lambda: BertPretrainer(bert()),
        {**BERT_INPUTS, "mask_positions": np.array([[1, 2], [0, 3]], "int32")},
    ),
    "gpt_causal_lm": (
        lambda: GPTCausalLM(gpt()), {"token_ids": IDS, "padding_mask": PADDING}
    ),
    "seq2seq_transformer": (
        lambda: Seq2SeqTransformer(vocabulary_size=V, num_layers=1, num_heads=2,
                                   hidden_dim=8, intermediate_dim=16),
        {"encoder_token_ids": IDS, "encoder_padding_mask": PADDING,
         "decoder_token_ids": IDS[:, :4], "decoder_padding_mask": PADDING[:, :4]},
    ),
    "transformer_xl_lm": (
        lambda: TransformerXLLM(vocabulary_size=V, num_layers=2, num_heads=2, hidden_dim=8,
                                intermediate_dim=16, memory_length=3),
        {"token_ids": IDS, "memory": RNG.normal(size=(B, 2, 3, 8)).astype("float32"),
         "memory_padding_mask": np.ones((B, 3), "int32")},
    ),
}


def assert_same(actual, expected, atol=None):
    """Equal outputs; `atol=None` compares two computation paths (tests/tolerances.py): every
    case has sums of at most 16 terms and at most 20 reductions in a row (the encoder-decoder's
    two embeddings, 6 in the encoder block, 12 in the decoder block with cross-attention)."""
    actual, expected = keras.tree.flatten(actual), keras.tree.flatten(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        tolerance = float32_path_atol(e, reduction=16, depth=20) if atol is None else atol
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=tolerance)


@pytest.mark.parametrize("name", list(CASES))
def test_keras_file_round_trip(name, tmp_path):
    build, inputs = CASES[name]
    model = build()
    expected = model.predict(inputs, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    assert type(loaded) is type(model)
    assert_same(loaded.predict(inputs, verbose=0), expected, atol=1e-6)


@pytest.mark.tensorflow
@pytest.mark.parametrize("name", list(CASES))
def test_saved_model_export(name, tmp_path):
    import tensorflow as tf

    build, inputs = CASES[name]
    model = build()
    expected = model.predict(inputs, verbose=0)
    model.export(str(tmp_path / "saved_model"), format="tf_saved_model", verbose=0)
    reloaded = tf.saved_model.load(str(tmp_path / "saved_model"))  # keep it: owns the variables
    served = reloaded.serve({k: tf.constant(v) for k, v in inputs.items()})
    served = keras.tree.map_structure(lambda t: t.numpy(), served)
    if isinstance(expected, dict):
        assert sorted(served) == sorted(expected)
        served = {k: served[k] for k in expected}
    assert_same(served, expected)  # SavedModel graph vs Keras predict
