"""`export_translation_tflite`'s arguments (its files are converted and decoded in
test_translation_exporter.py)."""

import pytest

from keras_attn.export.tflite.translation_tflite import export_translation_tflite
from keras_attn.export.tflite.translation_tflite import translation_graphs
from keras_attn.models.seq2seq_transformer import Seq2SeqTransformer

pytestmark = pytest.mark.tensorflow  # TFLite conversion


@pytest.fixture(scope="module")
def graphs():
    model = Seq2SeqTransformer(vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
                               intermediate_dim=16)
    return translation_graphs(model, max_length=6)


def test_the_graphs_hold_the_caches(graphs):
    encoder, step = graphs
    assert list(encoder.output) == ["cross_attention_cache"]
    assert tuple(encoder.output["cross_attention_cache"].shape[1:]) == (2, None, 2, 4)
    assert tuple(step.input["self_attention_cache"].shape[1:]) == (1, 2, 6, 2, 4)
    assert "encoder_outputs" not in step.input


@pytest.mark.parametrize("variant, lengths, message", [
    ("int4", [8], "must be one of"),
    ("fp32", [16, 8], "increasing positive ints"),
    ("fp32", [], "increasing positive ints"),
    ("int8", [8], "takes the quantize_model copies"),
])
def test_bad_arguments_are_refused_before_converting(graphs, tmp_path, variant, lengths,
                                                     message):
    with pytest.raises(ValueError, match=message):
        export_translation_tflite(*graphs, tmp_path / "t.tflite", lengths, variant)
