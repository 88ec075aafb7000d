"""`Backbone` and `TaskModel`: every backbone's `token_embedding`, `transformer_layers`,
`from_preset` (overrides, config round trip, unknown names) and the task models'
`from_preset`, against expectations written out here."""

import keras
import numpy as np
import pytest

from keras_attn import models
from keras_attn.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_attn.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_attn.layers.transformer_xl_block import TransformerXLBlock
from keras_attn.layers.xlnet_block import XLNetBlock
from keras_attn.models import AttentionRNNSeq2Seq
from keras_attn.models import Backbone
from keras_attn.models import BertBackbone
from keras_attn.models import BertClassifier
from keras_attn.models import BertTokenClassifier
from keras_attn.models import GPTBackbone
from keras_attn.models import GPTCausalLM
from keras_attn.models import Seq2SeqTransformer
from keras_attn.models import TaskModel
from keras_attn.models import TransformerXLLM
from keras_attn.models import XLNetBackbone
from keras_attn.models import XLNetClassifier
from keras_attn.models import XLNetLM

IDS = np.array([[5, 6, 7, 0], [3, 4, 2, 9]], "int32")
MASK = (IDS > 0).astype("int32")
ENCODER = {"token_ids": IDS, "segment_ids": np.array([[0, 0, 1, 1]] * 2, "int32"),
           "padding_mask": MASK}
SEQ2SEQ = {"encoder_token_ids": IDS, "encoder_padding_mask": MASK,
           "decoder_token_ids": IDS[:, ::-1], "decoder_padding_mask": MASK[:, ::-1]}


def xl_inputs(model):
    return {"token_ids": IDS, "memory": np.ones((2, 2, 3, 32), "float32"),
            "memory_padding_mask": np.array([[0, 1, 1]] * 2, "int32")}


# (class, preset, overrides, inputs, family in the error, known presets, embedding table
# shape, block classes in order, block names in order). Sizes are those of the presets
# (bert_tiny: H = 128; gpt2_tiny: V = 100, H = 32; the others H = 32 or 16).
CASES = {
    "bert": (BertBackbone, "bert_tiny", dict(vocabulary_size=50, max_sequence_length=16),
             lambda model: ENCODER, "BERT",
             ["bert_base", "bert_large", "bert_mini", "bert_small", "bert_tiny",
              "minilm_l6_h384"],
             (50, 128), [TransformerEncoderBlock] * 2,
             ["transformer_layer_0", "transformer_layer_1"]),
    "gpt": (GPTBackbone, "gpt2_tiny", dict(num_layers=3),
            lambda model: {"token_ids": IDS, "padding_mask": MASK}, "GPT",
            ["gpt2_large", "gpt2_medium", "gpt2_small", "gpt2_tiny", "gpt2_xl"],
            (100, 32), [TransformerDecoderBlock] * 3,
            ["transformer_layer_0", "transformer_layer_1", "transformer_layer_2"]),
    "xlnet": (XLNetBackbone, "xlnet_tiny", dict(vocabulary_size=50),
              lambda model: ENCODER, "XLNet",
              ["xlnet_base_cased", "xlnet_large_cased", "xlnet_tiny"],
              (50, 32), [XLNetBlock] * 2, ["xlnet_layer_0", "xlnet_layer_1"]),
    "transformer_xl": (TransformerXLLM, "transformer_xl_tiny", dict(vocabulary_size=50),
                       xl_inputs, "TransformerXLLM",
                       ["transformer_xl_enwik8_12l", "transformer_xl_tiny"],
                       (50, 32), [TransformerXLBlock] * 2,
                       ["transformer_xl_layer_0", "transformer_xl_layer_1"]),
    "seq2seq": (Seq2SeqTransformer, "transformer_tiny", dict(vocabulary_size=50),
                lambda model: SEQ2SEQ, "Seq2SeqTransformer",
                ["transformer_base", "transformer_big", "transformer_tiny"],
                (50, 32), [TransformerEncoderBlock] * 2 + [TransformerDecoderBlock] * 2,
                ["encoder_layer_0", "encoder_layer_1", "decoder_layer_0", "decoder_layer_1"]),
    "attention_rnn": (AttentionRNNSeq2Seq, "attention_rnn_tiny", dict(vocabulary_size=50),
                      lambda model: SEQ2SEQ, "AttentionRNNSeq2Seq",
                      ["attention_rnn_small", "attention_rnn_tiny"],
                      (50, 16), [], []),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    cls, preset, overrides, inputs, *rest = CASES[request.param]
    keras.utils.set_random_seed(0)
    return (cls, preset, overrides, cls.from_preset(preset, **overrides), inputs, *rest)


def test_every_backbone_is_a_backbone_with_its_presets(case):
    cls, preset, overrides, model, *_ = case
    assert isinstance(model, Backbone)
    config = model.get_config()
    expected = {**cls.presets[preset], **overrides}
    assert expected != cls.presets[preset]  # the overrides change something
    assert {key: config[key] for key in expected} == expected


def test_token_embedding_is_the_models_token_table(case):
    *_, model, _, _, _, table_shape, _, _ = case
    embedding = model.token_embedding
    assert isinstance(embedding, keras.layers.Embedding)
    assert tuple(embedding.embeddings.shape) == table_shape
    # The table is one of the model's own weights, not a copy.
    assert any(weight is embedding.embeddings for weight in model.weights)


def test_transformer_layers_are_the_blocks_in_order(case):
    *_, model, _, _, _, _, block_classes, block_names = case
    blocks = model.transformer_layers
    assert [type(block) for block in blocks] == block_classes
    assert [block.name for block in blocks] == block_names
    assert all(block is model.get_layer(block.name) for block in blocks)


def test_config_round_trip_gives_the_same_model(case):
    cls, _, _, model, inputs, *_ = case
    config = model.get_config()
    copy = cls.from_config(config)
    assert copy.count_params() == model.count_params() > 0
    assert copy.get_config() == config
    copy.set_weights(model.get_weights())
    x = inputs(model)
    expected = keras.tree.flatten(model(x))
    actual = keras.tree.flatten(copy(x))
    assert len(actual) == len(expected)
    for a, b in zip(actual, expected):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a),
                                   keras.ops.convert_to_numpy(b), atol=1e-6)


def test_unknown_preset_names_the_known_ones(case):
    cls, *_, family, known, _, _, _ = case
    assert sorted(cls.presets) == known
    with pytest.raises(ValueError, match=f"Unknown {family} preset") as error:
        cls.from_preset("no_such_preset")
    message = str(error.value)
    assert "Received: name='no_such_preset'" in message
    assert all(repr(name) in message for name in known)


def test_backbone_and_task_model_are_exported():
    assert models.Backbone is Backbone and models.TaskModel is TaskModel
    assert {"Backbone", "TaskModel"} <= set(models.__all__)


def test_task_from_preset_splits_head_and_backbone_arguments():
    keras.utils.set_random_seed(0)
    # Positional num_classes, head dropout, backbone overrides: today's signature.
    classifier = BertClassifier.from_preset("bert_tiny", 3, dropout=0.2, num_layers=1,
                                            vocabulary_size=30, max_sequence_length=8)
    assert isinstance(classifier, TaskModel)
    assert (classifier.num_classes, classifier.dropout) == (3, 0.2)
    backbone = classifier.backbone
    assert (backbone.num_layers, backbone.vocabulary_size, backbone.dropout) == (1, 30, 0.1)
    assert len(backbone.transformer_layers) == 1
    tagger = BertTokenClassifier.from_preset("bert_tiny", num_labels=4, use_crf=True,
                                             num_layers=1, vocabulary_size=30)
    assert (tagger.num_labels, tagger.use_crf, tagger.backbone.num_layers) == (4, True, 1)


def test_task_from_preset_defaults_and_errors():
    keras.utils.set_random_seed(0)
    assert XLNetLM.from_preset("xlnet_tiny", vocabulary_size=20).backbone.two_stream
    head = XLNetClassifier.from_preset("xlnet_tiny", num_classes=2, vocabulary_size=20)
    assert not head.backbone.two_stream and head.num_classes == 2
    lm = GPTCausalLM.from_preset("gpt2_tiny", num_layers=1)
    assert lm.backbone.num_layers == 1 and lm.backbone.token_embedding.input_dim == 100
    with pytest.raises(TypeError, match="num_classes"):
        BertClassifier.from_preset("bert_tiny")
    with pytest.raises(ValueError, match="Unknown BERT preset.*Received: name='bert_xxl'"):
        BertClassifier.from_preset("bert_xxl", num_classes=2)
