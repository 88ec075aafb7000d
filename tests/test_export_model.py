"""Tests of `keras_attn.export.export_model`: the README's functional model, trained with
`fit` on the package's sample sentiment data, exported from Python as `keras-attn export`
exports a run (int8 within the budget on the file itself, fp32, self-describing files, the
report)."""

import csv
import json

import keras
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from keras_attn.export.export_model import export_model
from keras_attn.export.tflite.tflite_metadata import associated_files
from keras_attn.layers import TokenAndPositionEmbedding
from keras_attn.layers import TransformerEncoderBlock
from keras_attn.layers.crf import viterbi_decode
from keras_attn.models import BertBackbone
from keras_attn.models import BertTokenClassifier
from keras_attn.quantization import QuantizationRecipe
from keras_attn.stages.demo import SAMPLE_DATA
from keras_attn.text import WordPieceTokenizer
from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.labelled_examples import encode_sentences
from keras_attn.text.labelled_examples import id_inputs
from tests.resources import minilm_directory

pytestmark = pytest.mark.tensorflow

LABELS = ["negative", "positive"]
LENGTH = 32


def sentiment(split, tokenizer):
    with open(SAMPLE_DATA / f"sentiment_{split}.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    ids = tokenizer([row["sentence"] for row in rows])
    inputs = {name: np.asarray(ids[name], "int32") for name in ("token_ids", "segment_ids")}
    return inputs, np.array([LABELS.index(row["label"]) for row in rows])


def readme_model(vocabulary_size):
    """The README's "Using the layers" model, smaller (2 blocks of width 64)."""
    token_ids = keras.Input((LENGTH,), dtype="int32", name="token_ids")
    segment_ids = keras.Input((LENGTH,), dtype="int32", name="segment_ids")
    x = TokenAndPositionEmbedding(vocabulary_size=vocabulary_size, sequence_length=LENGTH,
                                  embedding_dim=64, num_segments=2, mask_zero=True)(
        token_ids, segment_ids=segment_ids)
    for _ in range(2):
        x = TransformerEncoderBlock(num_heads=4, intermediate_dim=128,
                                    activation="gelu_approximate")(x)
    logits = keras.layers.Dense(2)(x[:, 0])
    return keras.Model({"token_ids": token_ids, "segment_ids": segment_ids}, logits)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    keras.utils.set_random_seed(0)
    tokenizer = WordPieceTokenizer(str(minilm_directory() / "vocab.txt"),
                                   sequence_length=LENGTH)
    train, y_train = sentiment("train", tokenizer)
    dev, y_dev = sentiment("dev", tokenizer)
    model = readme_model(tokenizer.vocabulary_size())
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(train, y_train, epochs=15, batch_size=16, verbose=0)
    batches = [{name: value[i:i + 32] for name, value in train.items()}
               for i in range(0, len(y_train), 32)]
    output = tmp_path_factory.mktemp("export_model")
    report = export_model(model, output, batches, (dev, y_dev), tokenizer=tokenizer,
                          labels=LABELS)
    return model, tokenizer, dev, y_dev, output, report, (train, y_train)


def file_logits(path, inputs):
    runner = Interpreter(model_path=str(path)).get_signature_runner()
    return np.concatenate([list(runner(**{name: value[i:i + 1] for name, value in
                                          inputs.items()}).values())[0]
                           for i in range(len(inputs["token_ids"]))])


def test_the_int8_file_is_within_the_budget_of_the_float_model(exported):
    model, _, dev, y_dev, output, report, (train, y_train) = exported
    # The model fit its 106 training sentences; from scratch it reaches 59 % on the 34 dev
    # sentences (too few to generalize from): the budget holds the file to that.
    assert np.mean(model.predict(train, verbose=0).argmax(-1) == y_train) >= 0.95
    float_logits = model.predict(dev, verbose=0)
    float_accuracy = np.mean(float_logits.argmax(-1) == y_dev)
    int8_logits = file_logits(output / "model_int8.tflite", dev)
    int8_accuracy = np.mean(int8_logits.argmax(-1) == y_dev)
    assert np.mean(int8_logits.argmax(-1) == float_logits.argmax(-1)) >= 0.9
    budget = report["quantization_budget"]
    # The default budget on 34 examples: one example (2.94 points).
    assert budget["max_accuracy_drop"] == pytest.approx(100 / len(y_dev), abs=1e-4)
    assert budget["file"]["within_budget"]
    # The file measured beside its score: the network, before its metadata is added.
    first = budget["file"]["steps"][0]
    assert 0.8 < first["size_bytes"] / (output / "model_int8.tflite").stat().st_size < 1
    assert first["p50_ms"] > 0
    assert 100 * (float_accuracy - int8_accuracy) <= budget["max_accuracy_drop"] + 1e-9
    rows = {row["artifact"]: row for row in report["artifacts"]}
    assert rows["model_int8.tflite"]["metric"] == pytest.approx(int8_accuracy)
    assert rows["model.keras (float)"]["metric"] == pytest.approx(float_accuracy)
    fp32 = file_logits(output / "model_fp32.tflite", dev)
    np.testing.assert_allclose(fp32, model.predict(dev, verbose=0), atol=1e-4)
    assert rows["model_fp32.tflite"]["latency"][0]["p50_ms"] > 0


def test_the_int8_file_computes_what_the_saved_qat_model_computes(exported):
    _, _, dev, _, output, report, _ = exported
    qat = keras.saving.load_model(output / "model_qat.keras")
    expected = keras.ops.convert_to_numpy(qat(dev, training=False))
    logits = file_logits(output / "model_int8.tflite", dev)
    step = float(qat.layers[-1].output_quantizer.step())
    steps = np.abs(logits - expected).max(-1) / step
    assert np.median(steps) <= 2.01 and steps.max() <= 8.01, (np.median(steps), steps.max())
    assert report["float_ops"] == list(report["quantization_budget"]["file"]["float_ops"])
    assert not [op for op in report["artifacts"][2]["ops"] if op.startswith("Flex")]


def test_the_files_describe_themselves_and_the_report_is_written(exported):
    _, tokenizer, _, _, output, report, _ = exported
    for name in ("model_int8.tflite", "model_fp32.tflite"):
        files = associated_files(output / name)
        assert files["vocab.txt"].decode().splitlines() == tokenizer.get_vocabulary()
        assert files["labels.txt"].decode().splitlines() == LABELS
        card = json.loads(files["model_card.json"])
        assert [entry["name"] for entry in card["inputs"]] == ["token_ids", "segment_ids"]
        assert card["task"] == "classification" and card["sequence_length"] == LENGTH
    assert json.loads((output / "export_report.json").read_text()) == report
    markdown = (output / "export_report.md").read_text()
    assert "## int8 accuracy budget" in markdown and "`model_int8.tflite`" in markdown
    assert report["float_layers"] == [] and "left in float" not in markdown


def test_bad_arguments_are_named_before_anything_is_written(tmp_path):
    model = readme_model(50)
    x = {"token_ids": np.ones((2, LENGTH), "int32"), "segment_ids": np.zeros((2, LENGTH),
                                                                          "int32")}
    y = np.array([0, 1])
    output = tmp_path / "export"
    with pytest.raises(ValueError, match="validation_data` must be `\\(x, y\\)"):
        export_model(model, output, [x], x)
    with pytest.raises(ValueError, match="labels must be integers"):
        export_model(model, output, [x], (x, np.array([0.5, 1.0])))
    with pytest.raises(ValueError, match="2 inputs but 3 labels"):
        export_model(model, output, [x], (x, np.array([0, 1, 1])))
    with pytest.raises(ValueError, match="names 3 labels but the model has 2 outputs"):
        export_model(model, output, [x], (x, y), tokenizer=object(), labels=["a", "b", "c"])
    with pytest.raises(ValueError, match="holds no batch"):
        export_model(model, output, [], (x, y))
    with pytest.raises(ValueError, match="both `tokenizer` and `labels`"):
        export_model(model, output, [x], (x, y), labels=LABELS)
    with pytest.raises(ValueError, match="runs no QAT epochs"):
        export_model(model, output, [x], (x, y), recipe=QuantizationRecipe(qat_epochs=1))
    assert not output.exists()


def entities(split, tokenizer, labels):
    """The sample entity sentences: the three id inputs, `label_mask` (first pieces) and the
    `(N, LENGTH)` tag ids (-100 on the other positions)."""
    path = SAMPLE_DATA / f"entities_{split}.txt"
    examples = encode_sentences(list(ConllReader(path)), tokenizer, labels, str(path),
                                log=lambda message: None)
    inputs = id_inputs(examples, LENGTH)
    y = np.full((len(examples), LENGTH), -100, "int32")
    for row, example in enumerate(examples):
        y[row, :len(example["labels"])] = example["labels"]
    return {**inputs, "label_mask": (y != -100).astype("int32")}, y


# 26 s without the CRF, 60 s with it (its fit runs Viterbi) on 2 cores: the slow stage.
@pytest.mark.slow
@pytest.mark.parametrize("use_crf", [False, True])
def test_a_tagger_with_or_without_a_crf_exports_its_emissions(use_crf, tmp_path):
    """`BertTokenClassifier` fit on the sample entity sentences: its files hold the
    emissions (a CRF decodes outside them, over `label_mask`), the int8 file within the
    budget of the float model in token accuracy, the tags of the file decoded as the
    Keras model decodes its own emissions."""
    keras.utils.set_random_seed(0)
    tokenizer = WordPieceTokenizer(str(minilm_directory() / "vocab.txt"),
                                   sequence_length=LENGTH, lowercase=False)
    tags = sorted({tag for sentence in ConllReader(SAMPLE_DATA / "entities_train.txt")
                   for tag in sentence.tags})
    labels = LabelVocabulary(tags)
    train, y_train = entities("train", tokenizer, labels)
    if not use_crf:  # only a CRF reads it
        del train["label_mask"]
    # Scored on 80 training sentences: from scratch, 200 sentences teach no entity of the
    # dev sentences (68 % token accuracy, 64 % are O); what is checked is the file against
    # the float model, on a model that tags.
    dev, y_dev = {name: value[:80] for name, value in train.items()}, y_train[:80]
    backbone = BertBackbone(vocabulary_size=tokenizer.vocabulary_size(), num_layers=1,
                            num_heads=2, hidden_dim=32, intermediate_dim=64,
                            max_sequence_length=LENGTH)
    model = BertTokenClassifier(backbone, num_labels=len(tags), use_crf=use_crf)
    model.compile(keras.optimizers.Adam(3e-3), None if use_crf else
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                             ignore_class=-100))
    model.fit(train, y_train, epochs=20, batch_size=16, verbose=0)
    batches = [{name: value[i:i + 32] for name, value in train.items()}
               for i in range(0, len(y_train), 32)]
    # The backbone takes any length: the files get the validation inputs' (LENGTH).
    report = export_model(model, tmp_path, batches, (dev, y_dev), tokenizer=tokenizer,
                          labels=tags)
    assert report["sequence_length"] == LENGTH

    runner = Interpreter(model_path=str(tmp_path / "model_int8.tflite")).get_signature_runner()
    assert sorted(runner.get_input_details()) == ["padding_mask", "segment_ids", "token_ids"]
    logits = file_logits(tmp_path / "model_int8.tflite",
                         {name: dev[name] for name in ("token_ids", "segment_ids",
                                                       "padding_mask")})
    kept = y_dev != -100
    if use_crf:
        crf = model.get_layer("crf")
        predicted = keras.ops.convert_to_numpy(viterbi_decode(
            logits, crf.transitions, crf.start_transitions, crf.end_transitions,
            mask=dev["label_mask"].astype(bool)))
        expected = keras.ops.convert_to_numpy(model(dev, training=False)["tags"])
    else:
        predicted = logits.argmax(-1)
        expected = model.predict(dev, verbose=0).argmax(-1)
    float_accuracy = np.mean(expected[kept] == y_dev[kept])
    int8_accuracy = np.mean(predicted[kept] == y_dev[kept])
    assert float_accuracy >= 0.85  # most tokens are O: above it, entities were learned
    assert np.mean(y_dev[kept] == tags.index("O")) < float_accuracy
    rows = {row["artifact"]: row for row in report["artifacts"]}
    assert rows["model_int8.tflite"]["metric"] == pytest.approx(int8_accuracy)
    assert rows["model.keras (float)"]["metric"] == pytest.approx(float_accuracy)
    assert 100 * (float_accuracy - int8_accuracy) <= report["quantization_budget"][
        "max_accuracy_drop"] + 1e-9
    assert report["task"] == "ner"
    card = json.loads(associated_files(tmp_path / "model_int8.tflite")["model_card.json"])
    assert card["labels"] == tags
    if use_crf:  # an app decodes the emissions with the transitions of the card
        np.testing.assert_allclose(card["crf"]["transitions"],
                                   model.get_layer("crf").transitions.numpy(), atol=1e-6)
    else:
        assert card["crf"] is None
