"""Tests of `keras_attn.runs.task_head`: the id inputs, the length rule and CRF decoding."""

import ast
import functools
import itertools
import pathlib
import types

import keras
import numpy as np
import pytest

from keras_attn.layers.crf import CRF
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.runs import task_head
from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.runs.task_head import ID_INPUTS
from keras_attn.runs.task_head import ClassificationHead
from keras_attn.runs.task_head import TaggingHead
from keras_attn.runs.task_head import check_length
from keras_attn.runs.task_head import crf_tags
from keras_attn.runs.task_head import crf_word_tags
from keras_attn.runs.task_head import head_for_task
from keras_attn.runs.task_head import max_sequence_length
from keras_attn.runs.task_registry import task_spec
from keras_attn.text.label_vocabulary import LabelVocabulary

K = 3  # tags
RNG = np.random.default_rng(7)
# Specials (-1) at both ends and as padding; words of 1 to 3 pieces; a row without words.
WORD_IDS = np.array([
    [-1, 0, 0, 1, 2, 2, 2, -1],
    [-1, 0, 1, 1, 2, 3, -1, -1],
    [-1, 0, -1, -1, -1, -1, -1, -1],
    [-1, -1, -1, -1, -1, -1, -1, -1],
])
EMISSIONS = RNG.normal(size=WORD_IDS.shape + (K,)).astype("float32")


def random_crf(rng=RNG):
    return types.SimpleNamespace(transitions=rng.normal(size=(K, K)).astype("float32"),
                                 start_transitions=rng.normal(size=K).astype("float32"),
                                 end_transitions=rng.normal(size=K).astype("float32"))


def brute_force_tags(emissions, crf, word_ids):
    """The best of all K^n tag paths over each row's first pieces, by enumeration."""
    tags = np.zeros(word_ids.shape, "int32")
    for row, ids in enumerate(word_ids):
        first = [t for t in range(len(ids)) if ids[t] >= 0 and (t == 0 or ids[t] != ids[t - 1])]
        if not first:
            continue

        def score(path):
            total = crf.start_transitions[path[0]] + crf.end_transitions[path[-1]]
            total += sum(emissions[row, t, y] for t, y in zip(first, path))
            total += sum(crf.transitions[a, b] for a, b in zip(path, path[1:]))
            return total

        best = max(itertools.product(range(K), repeat=len(first)), key=score)
        tags[row, first] = best
    return tags


def test_id_inputs_are_the_backbone_inputs_in_order():
    backbone = BertBackbone(vocabulary_size=10, num_layers=1, num_heads=1, hidden_dim=4,
                            intermediate_dim=8, max_sequence_length=8)
    assert ID_INPUTS == tuple(backbone.input)
    assert sorted(ID_INPUTS) == sorted(tensor.name for tensor in backbone.inputs)


@pytest.mark.parametrize("seed", range(3))
def test_crf_word_tags_are_the_best_path_over_first_pieces(seed):
    rng = np.random.default_rng(seed)
    crf = random_crf(rng)
    emissions = rng.normal(size=WORD_IDS.shape + (K,)).astype("float32")
    tags = crf_word_tags(emissions, crf, WORD_IDS)
    assert isinstance(tags, np.ndarray) and tags.dtype == np.int32
    np.testing.assert_array_equal(tags, brute_force_tags(emissions, crf, WORD_IDS))


def test_crf_word_tags_read_a_crf_layers_weights():
    layer = CRF(K)
    layer.build((None, None, K))
    crf = random_crf()
    layer.set_weights([crf.transitions, crf.start_transitions, crf.end_transitions])
    np.testing.assert_array_equal(crf_word_tags(EMISSIONS, layer, WORD_IDS),
                                  brute_force_tags(EMISSIONS, crf, WORD_IDS))


def test_crf_tags_decode_over_the_mask_given():
    crf = random_crf()
    # Every piece a word: the mask of the real pieces, and float64 emissions cast.
    word_ids = np.where(WORD_IDS >= 0, np.arange(WORD_IDS.shape[1]), -1)
    mask = word_ids >= 0
    np.testing.assert_array_equal(crf_tags(EMISSIONS.astype("float64"), crf, mask),
                                  brute_force_tags(EMISSIONS, crf, word_ids))
    assert not crf_tags(EMISSIONS, crf, mask)[~mask].any()  # 0 outside the mask


def test_check_length_passes_up_to_the_limit_and_without_one():
    check_length(16, 16, "sequence_length")
    check_length(10**6, None, "sequence_length")


def test_check_length_says_what_where_and_how_to_fix():
    with pytest.raises(ValueError) as error:
        check_length(17, 16, "sequence_length")
    assert str(error.value) == ("sequence_length=17 exceeds the max_sequence_length=16 of the "
                                "model (the rows of its position table): use at most 16")
    with pytest.raises(RunDirectoryError, match=r"data\.max_length=40 exceeds the "
                                                r"max_sequence_length=32 of the encoder in "
                                                r"runs/mlm .*: set data\.max_length=32$"):
        check_length(40, 32, "data.max_length", "the encoder in runs/mlm",
                     fix="set data.max_length=32", error=RunDirectoryError)


def test_check_length_takes_an_error_factory():
    with pytest.raises(ConfigError) as error:
        check_length(9, 8, "data.max_length",
                     error=functools.partial(ConfigError, where="config.yaml"))
    assert error.value.where == "config.yaml"
    assert str(error.value).startswith("config.yaml: data.max_length=9 exceeds the "
                                       "max_sequence_length=8 of the model")


def test_max_sequence_length_of_backbones_embeddings_and_other_models():
    backbone = BertBackbone(vocabulary_size=10, num_layers=1, num_heads=1, hidden_dim=4,
                            intermediate_dim=8, max_sequence_length=12)
    assert max_sequence_length(keras.Model(backbone.input, backbone.output)) == 12
    ids = keras.Input((None,), dtype="int32")
    embedded = TokenAndPositionEmbedding(10, 6, 4)(ids)
    assert max_sequence_length(keras.Model(ids, embedded)) == 6
    x = keras.Input((3,))
    assert max_sequence_length(keras.Model(x, keras.layers.Dense(2)(x))) is None


def test_the_contract_imports_no_pipeline_library():
    source = pathlib.Path(task_head.__file__).read_text()
    modules = [node.module for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.ImportFrom)]
    modules += [alias.name for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Import) for alias in node.names]
    allowed = ("keras_attn.layers", "keras_attn.text", "keras_attn.runs.task_registry",
               "keras", "numpy")
    outside = [m for m in modules if not any(m == a or m.startswith(a + ".") for a in allowed)]
    assert not outside


def test_head_for_each_deployable_task():
    labels = LabelVocabulary(["O", "B-PER", "I-PER"])
    crf = random_crf()
    assert isinstance(head_for_task("classification"), ClassificationHead)
    head = head_for_task("ner", labels, crf)
    assert isinstance(head, TaggingHead) and head.labels is labels and head.crf is crf
    for head in (ClassificationHead, TaggingHead):
        assert head.metric == task_spec(head.task).metric
    with pytest.raises(ValueError, match="`task` must be one of"):
        head_for_task("mlm")


def test_classification_head_scores_the_logits_as_they_are():
    head = ClassificationHead()
    logits = [np.array([2.0, 0.0]), np.array([0.0, 1.0]), np.array([3.0, 1.0])]
    examples = [{"label": 0}, {"label": 1}, {"label": 1}]
    outputs = [head.decode(row, example) for row, example in zip(logits, examples)]
    assert all(a is b for a, b in zip(outputs, logits))
    assert head.score(examples, outputs)["accuracy"] == pytest.approx(2 / 3)


def test_tagging_head_decodes_a_crfs_emissions_over_first_pieces_and_scores_entities():
    labels = LabelVocabulary(["O", "B-PER", "I-PER"])
    crf = random_crf(np.random.default_rng(3))
    word_ids = WORD_IDS[0]  # 3 words over 8 pieces
    example = {"token_ids": np.zeros(len(word_ids), "int32"), "word_ids": word_ids,
               "tags": ["B-PER", "I-PER", "O"]}
    emissions = EMISSIONS[0]
    tags = TaggingHead(labels, crf).decode(emissions, example)["tags"]
    np.testing.assert_array_equal(tags, brute_force_tags(EMISSIONS[:1], crf, WORD_IDS[:1])[0])
    assert TaggingHead(labels).decode(emissions, example) is emissions  # no CRF: argmax later
    # Gold tags as one-hot logits at each word's first piece: F1 1; all "O": F1 0.
    perfect = np.zeros((len(word_ids), K), "float32")
    perfect[[1, 3, 4], [1, 2, 0]] = 1.0
    assert TaggingHead(labels).score([example], [perfect])["f1"] == 1.0
    nothing = {"tags": np.zeros(len(word_ids), "int32")}
    assert TaggingHead(labels).score([example], [nothing])["f1"] == 0.0
