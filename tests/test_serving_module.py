"""The raw-text SavedModel: both signatures equal the Python path (tokenizer + Keras model)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.export.serving_module import export_saved_model
from keras_attn.export.serving_module import load_saved_model
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.text.entity_prediction import predict_entities
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.tokenizer import WordPieceTokenizer
from tests.resources import minilm_directory
from tests.resources import shared_data_file
from tests.test_word_splitter import HARD_CASES
from tests.tolerances import float32_path_atol
from tests.tolerances import kernel_gain

pytestmark = pytest.mark.tensorflow  # TFLite / SavedModel / tf-text: TensorFlow only

SEQUENCE_LENGTH = 16
NER_LABELS = LabelVocabulary(
    ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]
)
TEXTS = HARD_CASES + [
    "Peter Blackburn visits Paris and the European Union in Brussels .",
    "EU rejects German call to boycott British lamb, says J.R.R. Tolkien's friend in 北京.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer(
        str(minilm_directory() / "vocab.txt"), sequence_length=SEQUENCE_LENGTH
    )


def _backbone(tokenizer):
    keras.utils.set_random_seed(7)
    return BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size(), num_layers=1, num_heads=2,
        hidden_dim=16, intermediate_dim=32, max_sequence_length=SEQUENCE_LENGTH,
    )


def _spread_kernels(backbone):
    # BERT's initializer (std 0.02) makes a random 1-layer model's [CLS] state almost the same
    # for every text, so a classifier that tells texts apart must magnify that spread (about
    # 4e4 times), and the float32 rounding of two paths with it. Kernels of std 1/sqrt(fan_in)
    # spread the pooled states to order 1, so the head's gain stays near 10.
    rng = np.random.default_rng(11)
    for weight in backbone.weights:
        if len(weight.shape) >= 2 and "embeddings" not in weight.path:
            weight.assign(rng.normal(scale=weight.shape[0] ** -0.5, size=tuple(weight.shape)))
    return backbone


def _path_atol(model):
    """Tolerance between the SavedModel and the eager model (tests/tolerances.py): one block
    of 6 reductions plus the embedding norm and the pooler, sums of up to the intermediate
    size, magnified by the output kernel's gain (probabilities move at most half as much)."""
    return float32_path_atol(1.0, reduction=32, depth=6 + 2,
                             gain=kernel_gain(model.get_layer("logits").kernel.numpy()))


def _scale_logits(model, scale, bias_scale=0.5):
    # Random tiny models predict almost one class; a larger output kernel spreads the
    # predictions over all tags (I- after O included, so the BIO repair is exercised).
    dense = model.get_layer("logits")
    rng = np.random.default_rng(3)
    dense.kernel.assign(rng.normal(scale=scale, size=tuple(dense.kernel.shape)))
    dense.bias.assign(rng.normal(scale=bias_scale, size=tuple(dense.bias.shape)))


@pytest.fixture(scope="module")
def classifier(tokenizer, tmp_path_factory):
    model = BertClassifier(_spread_kernels(_backbone(tokenizer)), num_classes=3)
    # The pooled [CLS] state of a random model hardly varies between texts: point the
    # output kernel along its main direction of variation, so the classes differ.
    packed = tokenizer(TEXTS)
    pooled = np.asarray(model.backbone({
        "token_ids": packed["token_ids"], "segment_ids": packed["segment_ids"],
        "padding_mask": tf.cast(packed["padding_mask"], tf.int32),
    })["pooled_output"], dtype="float64")  # (N, H)
    centered = pooled - pooled.mean(0)
    direction = np.linalg.svd(centered, full_matrices=False)[2][0]  # (H,)
    direction /= np.abs(centered @ direction).max()
    kernel = np.stack([-direction, 0.3 * direction, direction], axis=1) * 4.0  # (H, 3)
    dense = model.get_layer("logits")
    dense.kernel.assign(kernel)
    dense.bias.assign(-pooled.mean(0) @ kernel)
    labels = LabelVocabulary(["negative", "neutral", "positive"])
    path = export_saved_model(model, tokenizer, labels, tmp_path_factory.mktemp("cls") / "sm")
    return model, labels, load_saved_model(path)


@pytest.fixture(scope="module", params=[False, True], ids=["softmax", "crf"])
def tagger(request, tokenizer, tmp_path_factory):
    model = BertTokenClassifier(_backbone(tokenizer), num_labels=len(NER_LABELS),
                                use_crf=request.param)
    _scale_logits(model, 3.0)
    if request.param:
        rng = np.random.default_rng(5)
        for weight in (model.crf.transitions, model.crf.start_transitions,
                       model.crf.end_transitions):
            weight.assign(rng.normal(scale=2.0, size=tuple(weight.shape)))
    path = export_saved_model(model, tokenizer, NER_LABELS, tmp_path_factory.mktemp("ner") / "sm")
    return model, load_saved_model(path)


# --- Classification ------------------------------------------------------------------------------


def test_classification_text_signature_equals_python_path(classifier, tokenizer):
    model, labels, saved = classifier
    out = saved.signatures["serving_default"](text=tf.constant(TEXTS))
    packed = tokenizer(TEXTS, return_num_truncated=True)
    logits = model({
        "token_ids": packed["token_ids"], "segment_ids": packed["segment_ids"],
        "padding_mask": tf.cast(packed["padding_mask"], tf.int32),
    }, training=False)
    logits = np.asarray(logits, dtype="float64")
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(out["probabilities"].numpy(), expected, atol=_path_atol(model))
    ids = expected.argmax(-1)
    assert out["label_id"].numpy().tolist() == ids.tolist()
    assert [x.decode() for x in out["label"].numpy()] == labels.decode(ids)
    assert len(set(ids.tolist())) > 1  # the predictions are not all one class
    assert out["num_truncated_tokens"].numpy().tolist() == packed["num_truncated"].numpy().tolist()
    # Words cut: pieces past [CLS] + 14 pieces that are not `##` continuations.
    vocabulary = tokenizer.get_vocabulary()
    cut_words = [
        sum(not vocabulary[i].startswith("##") for i in row[SEQUENCE_LENGTH - 2:])
        for row in tokenizer.tokenize(TEXTS).to_list()
    ]
    assert out["num_truncated_words"].numpy().tolist() == cut_words
    assert max(cut_words) > 0


def test_predict_ids_signature_equals_model(classifier, tokenizer):
    model, _, saved = classifier
    packed = tokenizer(TEXTS[:5])
    inputs = {
        "token_ids": packed["token_ids"], "segment_ids": packed["segment_ids"],
        "padding_mask": tf.cast(packed["padding_mask"], tf.int32),
    }
    out = saved.signatures["predict_ids"](**inputs)
    np.testing.assert_allclose(out["logits"].numpy(), model(inputs, training=False),
                               atol=_path_atol(model))


def test_metadata_and_assets(classifier, tokenizer):
    _, labels, saved = classifier
    meta = saved.signatures["metadata"]()
    assert [x.decode() for x in meta["labels"].numpy()] == list(labels.labels)
    assert int(meta["sequence_length"]) == SEQUENCE_LENGTH
    assert meta["task"].numpy() == b"classification"
    assets = {
        pathlib_name(asset.asset_path.numpy()): asset.asset_path.numpy()
        for asset in (saved.labels_file, saved.vocab_file)
    }
    with open(assets["labels.txt"], encoding="utf-8") as f:
        assert f.read().splitlines() == list(labels.labels)
    with open(assets["vocab.txt"], encoding="utf-8") as f:
        assert f.read().splitlines() == tokenizer.get_vocabulary()


def pathlib_name(path):
    return path.decode().rsplit("/", 1)[-1]


def test_wrong_dtype_errors_clearly(classifier):
    _, _, saved = classifier
    with pytest.raises(tf.errors.InvalidArgumentError, match="expected to be a string tensor"):
        saved.signatures["serving_default"](text=tf.constant([1, 2]))


# --- Tagging -------------------------------------------------------------------------------------


def _saved_entities(out, row):
    entities = []
    for j in range(int(out["num_entities"][row])):
        entities.append({
            "type": out["entity_type"][row, j].numpy().decode(),
            "start_word": int(out["entity_start_word"][row, j]),
            "end_word": int(out["entity_end_word"][row, j]),
            "start_char": int(out["entity_start"][row, j]),
            "end_char": int(out["entity_end"][row, j]),
            "text": out["entity_text"][row, j].numpy().decode(),
        })
    return entities


def _check_tagging(model, saved, tokenizer, texts):
    out = saved.signatures["serving_default"](text=tf.constant(texts))
    expected = predict_entities(model, tokenizer, NER_LABELS, texts)
    for row, reference in enumerate(expected):
        num_words = int(out["num_words"][row])
        words = [
            (w.decode(), s, e) for w, s, e in zip(
                out["words"][row, :num_words].numpy(),
                out["word_start"][row, :num_words].numpy().tolist(),
                out["word_end"][row, :num_words].numpy().tolist(),
            )
        ]
        assert words == reference["words"], texts[row]
        tags = [t.decode() for t in out["word_tags"][row, :num_words].numpy()]
        assert tags == reference["tags"], texts[row]
        assert _saved_entities(out, row) == reference["entities"], texts[row]
        assert int(out["num_truncated_words"][row]) == reference["num_truncated_words"]
        # Padding beyond the row's entities and words.
        assert out["entity_start"][row, int(out["num_entities"][row]):].numpy().tolist() == [
            -1] * (out["entity_start"].shape[1] - int(out["num_entities"][row]))
        assert all(t == b"" for t in out["word_tags"][row, num_words:].numpy())
    return expected


def test_tagging_hard_cases_equal_python_path(tagger, tokenizer):
    model, saved = tagger
    expected = _check_tagging(model, saved, tokenizer, TEXTS)
    assert sum(len(r["entities"]) for r in expected) >= 10
    assert sum(r["num_repairs"] for r in expected) > 0
    assert sum(r["num_truncated_words"] for r in expected) > 0


def test_tagging_conll_valid_sentences_equal_python_path(tagger, tokenizer):
    model, saved = tagger
    sentences, words = [], []
    for line in shared_data_file("conll2003/valid.txt").read_text(encoding="utf-8").split("\n"):
        if line.strip() and not line.startswith("-DOCSTART-"):
            words.append(line.split(" ")[0])
        elif words:
            sentences.append(" ".join(words))
            words = []
    texts = sentences[:120]
    expected = _check_tagging(model, saved, tokenizer, texts)
    assert sum(len(r["entities"]) for r in expected) >= 100


def test_tagging_predict_ids_equals_model(tagger, tokenizer):
    model, saved = tagger
    packed = tokenizer(TEXTS[:4])
    inputs = {
        "token_ids": packed["token_ids"], "segment_ids": packed["segment_ids"],
        "padding_mask": tf.cast(packed["padding_mask"], tf.int32),
    }
    if model.use_crf:
        inputs["label_mask"] = tf.cast(packed["padding_mask"], tf.int32)
    out = saved.signatures["predict_ids"](**inputs)
    expected = model(inputs, training=False)
    if model.use_crf:
        np.testing.assert_array_equal(out["tags"].numpy(), expected["tags"])
        expected = expected["logits"]
    np.testing.assert_allclose(out["logits"].numpy(), expected, atol=_path_atol(model))


def test_empty_batch_and_empty_texts(tagger):
    _, saved = tagger
    out = saved.signatures["serving_default"](text=tf.constant(["", "  "]))
    assert out["num_words"].numpy().tolist() == [0, 0]
    assert out["num_entities"].numpy().tolist() == [0, 0]
    assert tuple(out["entity_type"].shape) == (2, 0)


# --- Errors --------------------------------------------------------------------------------------


def test_bad_arguments(tokenizer):
    backbone = _backbone(tokenizer)
    model = BertClassifier(backbone, num_classes=3)
    with pytest.raises(ValueError, match="one label per model output"):
        export_saved_model(model, tokenizer, LabelVocabulary(["a", "b"]), "unused")
    with pytest.raises(ValueError, match="must be a classifier or a tagger .BertClassifier, "
                       "XLNetClassifier, BertTokenClassifier, XLNetTokenClassifier.. "
                       "Received: model=BertBackbone"):
        export_saved_model(backbone, tokenizer, LabelVocabulary(["a"]), "unused")
    tagger = BertTokenClassifier(backbone, num_labels=3)
    with pytest.raises(ValueError, match="IOB tags"):
        export_saved_model(tagger, tokenizer, LabelVocabulary(["B-X", "I-X", "other"]), "unused")
