"""`load_predictor` and `keras-attn predict`: every artifact of one exported classification run
and one exported NER run gives the Keras model's labels and entities; bad paths and side
files are clear errors.

The NER run's export takes another minute: its all-artifact test is `slow`; the default suite
checks NER on a SavedModel of a random tagger against the Python reference path."""

import io
import json
import shutil

import keras
import numpy as np
import onnx
import pytest

from keras_attn.export.serving_module import export_saved_model
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.stages.inference.predictor import PredictorError
from keras_attn.stages.inference.predictor import load_predictor
from keras_attn.text.entity_prediction import predict_entities
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.tokenizer import WordPieceTokenizer
from tests.exported_runs import classification_run
from tests.exported_runs import ner_run
from tests.tolerances import float32_path_atol

pytestmark = pytest.mark.tensorflow

FLOAT_ARTIFACTS = ("run", "run/model.keras", "export", "export/saved_model",
                   "export/model_fp32.tflite", "export/model_text.tflite", "export/model.onnx")
QUANTIZED_ARTIFACTS = ("export/model_int8.tflite", "export/model_dynamic_int8.tflite",
                       "export/model_fp16.tflite", "export/model_dynamic_int8.onnx")
CLASSIFICATION_TEXTS = ["the film was good", "Bad plot.", "a very dull story", "great acting",
                        "", "the the the the the the the the the the the the the the the good"]
NER_TEXTS = ["anna was in paris", "Marco Smith visited New York!", "", "the film",
             "the film was in rome , the film was very good and anna smith was in paris",
             "paris"]


@pytest.fixture(scope="module")
def classification(tmp_path_factory):
    return classification_run(tmp_path_factory.mktemp("classification"))


@pytest.fixture(scope="module", params=[False, True], ids=["softmax", "crf"])
def ner(request, tmp_path_factory):
    return ner_run(tmp_path_factory.mktemp("ner"), use_crf=request.param)


@pytest.fixture(scope="module")
def random_tagger(tmp_path_factory):
    """A random tagger whose large output kernel spreads its tags over every label (I- after
    O included), exported as a SavedModel: `(model, tokenizer, labels, saved_model_dir)`."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "anna", "paris", "was", "in",
             "the", "film", "new", "york", "##s", "marco", "smith"]
    tokenizer = WordPieceTokenizer(vocab, sequence_length=10)
    labels = LabelVocabulary(["O", "B-LOC", "B-PER", "I-LOC", "I-PER"])
    keras.utils.set_random_seed(5)
    model = BertTokenClassifier(BertBackbone(
        vocabulary_size=len(vocab), num_layers=1, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=10), num_labels=len(labels))
    dense = model.get_layer("logits")
    rng = np.random.default_rng(3)
    dense.kernel.assign(rng.normal(scale=3.0, size=tuple(dense.kernel.shape)))
    dense.bias.assign(rng.normal(scale=0.5, size=tuple(dense.bias.shape)))
    path = export_saved_model(model, tokenizer, labels,
                              tmp_path_factory.mktemp("tagger") / "saved_model")
    return model, tokenizer, labels, path


def _run_tokenizer(run):
    config = json.loads((run / "config.json").read_text())
    return WordPieceTokenizer(str(run / "vocab.txt"), lowercase=config["model"]["lowercase"],
                              sequence_length=config["data"]["max_length"])


def _keras_probabilities(run, texts):
    """The reference: the run's Keras model on the run's tokenizer, softmax in numpy."""
    model = keras.models.load_model(run / "model.keras")
    packed = _run_tokenizer(run)(texts)
    logits = keras.ops.convert_to_numpy(model({
        "token_ids": np.asarray(packed["token_ids"]), "segment_ids":
        np.asarray(packed["segment_ids"]), "padding_mask":
        np.asarray(packed["padding_mask"]).astype("int32")}, training=False)).astype("float64")
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


def _path_atol(run):
    """Float artifacts (LiteRT, ONNX Runtime, SavedModel) vs eager Keras run other kernels
    (tests/tolerances.py): 6 reductions a block plus the embedding norm, pooler and head, sums
    of up to the intermediate size; probabilities move at most as much as the logits."""
    backbone = keras.models.load_model(run / "model.keras").backbone
    return float32_path_atol(1.0, reduction=backbone.intermediate_dim,
                             depth=6 * backbone.num_layers + 3)


def _artifact(fixture, name):
    run, export = fixture
    return (run.parent / name) if name.startswith("run") else export.parent / name


def test_classification_artifacts_agree_with_the_keras_model(classification):
    run, _ = classification
    labels = LabelVocabulary.load(run / "labels.txt").labels
    reference = _keras_probabilities(run, CLASSIFICATION_TEXTS)
    float_atol = _path_atol(run)
    assert len(set(reference.argmax(-1).tolist())) == 2  # the toy run learned both labels
    kinds = {}
    for name in FLOAT_ARTIFACTS + QUANTIZED_ARTIFACTS:
        predictor = load_predictor(_artifact(classification, name))
        kinds[name] = predictor.kind
        assert predictor.task == "classification", name
        results = predictor.predict(CLASSIFICATION_TEXTS, batch_size=4)
        probabilities = np.array([[r["probabilities"][label] for label in labels]
                                  for r in results])
        tolerance = float_atol if name in FLOAT_ARTIFACTS else 0.05
        np.testing.assert_allclose(probabilities, reference, atol=tolerance, err_msg=name)
        assert [r["label"] for r in results] == [labels[i] for i in reference.argmax(-1)], name
    assert kinds == {
        "run": "keras", "run/model.keras": "keras", "export": "saved_model",
        "export/saved_model": "saved_model", "export/model_fp32.tflite": "tflite",
        "export/model_text.tflite": "text_tflite", "export/model.onnx": "onnx",
        "export/model_int8.tflite": "tflite", "export/model_dynamic_int8.tflite": "tflite",
        "export/model_fp16.tflite": "tflite", "export/model_dynamic_int8.onnx": "onnx"}


def test_ner_saved_model_gives_the_python_reference_entities(random_tagger):
    model, tokenizer, labels, path = random_tagger
    reference = predict_entities(model, tokenizer, labels, NER_TEXTS)
    predictor = load_predictor(path)
    assert (predictor.kind, predictor.task, predictor.labels) == ("saved_model", "ner", labels)
    results = predictor.predict(NER_TEXTS, batch_size=4)
    assert sum(len(r["entities"]) for r in reference) >= 4
    assert reference[4]["num_truncated_words"] > 0
    for result, ref in zip(results, reference):
        assert result["entities"] == [{"type": e["type"], "start": e["start_char"],
                                       "end": e["end_char"], "text": e["text"]}
                                      for e in ref["entities"]]
        assert [(w["text"], w["start"], w["end"], w["tag"]) for w in result["words"]] == \
            [(w, s, e, t) for (w, s, e), t in zip(ref["words"], ref["tags"])]
        assert result["num_truncated_words"] == ref["num_truncated_words"]


@pytest.mark.slow
def test_ner_artifacts_give_the_python_reference_entities(ner):
    run, _ = ner
    labels = LabelVocabulary.load(run / "labels.txt")
    model = keras.models.load_model(run / "model.keras")
    tokenizer = _run_tokenizer(run)
    reference = predict_entities(model, tokenizer, labels, NER_TEXTS)
    expected = [[(e["type"], e["start_char"], e["end_char"], e["text"]) for e in r["entities"]]
                for r in reference]
    # The toy tagger finds its entities, and the long text loses words to the length 16.
    assert ("PER", 0, 4, "anna") in expected[0] and ("LOC", 12, 17, "paris") in expected[0]
    assert reference[4]["num_truncated_words"] > 0
    artifacts = FLOAT_ARTIFACTS + QUANTIZED_ARTIFACTS
    if model.get_config().get("use_crf"):
        # The CRF's Viterbi path, from the model itself, is the reference's tags (a CRF
        # tagger's model_int8.tflite holds its calibrated QAT model's emissions).
        assert "crf" in [layer.name for layer in model.layers]
    else:
        _check_argmax_tags(model, tokenizer, labels, reference)
    for name in artifacts:
        predictor = load_predictor(_artifact(ner, name))
        assert predictor.task == "ner", name
        results = predictor.predict(NER_TEXTS, batch_size=4)
        got = [[(e["type"], e["start"], e["end"], e["text"]) for e in r["entities"]]
               for r in results]
        assert got == expected, name
        for text, result, ref in zip(NER_TEXTS, results, reference):
            for word in result["words"]:
                assert text[word["start"]:word["end"]] == word["text"], name
            assert result["num_truncated_words"] == ref["num_truncated_words"], name
            if predictor.kind != "text_tflite":  # the graph lists the words it located only
                assert [w["tag"] for w in result["words"]] == ref["tags"], name


def _check_argmax_tags(model, tokenizer, labels, reference):
    """Independent check of the first text: argmax at each word's first piece."""
    x = tokenizer.tokenize_words([["anna", "was", "in", "paris"]]).to_list()[0]
    ids = np.array([[tokenizer.cls_token_id] + [p[0] for p in x] + [tokenizer.sep_token_id]])
    logits = keras.ops.convert_to_numpy(model({"token_ids": ids, "segment_ids": 0 * ids,
                                               "padding_mask": 1 + 0 * ids}))[0]
    assert [labels.labels[i] for i in logits[1:5].argmax(-1)] == reference[0]["tags"]


def _copy(sources, directory):
    directory.mkdir(parents=True, exist_ok=True)
    for source in sources:
        shutil.copy(source, directory / source.name)
    return directory


def test_missing_and_inconsistent_side_files_are_clear_errors(classification, tmp_path):
    _, export = classification
    # The classifier's artifacts with a tagger's side files.
    ner_export = _copy([export / "vocab.txt"], tmp_path / "ner_export")
    card = json.loads((export / "model_card.json").read_text())
    card.update(task="ner", labels=["O", "B-LOC", "I-LOC"])
    (ner_export / "model_card.json").write_text(json.dumps(card))
    with pytest.raises(PredictorError, match="does not exist: give a run directory"):
        load_predictor(tmp_path / "missing.onnx")
    (tmp_path / "model.bin").write_bytes(b"\0")
    with pytest.raises(PredictorError, match=r"unknown kind of artifact '\.bin'"):
        load_predictor(tmp_path / "model.bin")
    with pytest.raises(PredictorError, match="is not a run directory"):
        load_predictor(tmp_path)
    # Every .tflite and .onnx file carries its card, vocabulary and labels (TFLite metadata,
    # ONNX metadata_props), model_text.tflite too: alone, each predicts what it predicts
    # beside the side files. Without them, the side files are needed.
    names = ["model_text.tflite", "model.onnx", "model_dynamic_int8.onnx"]
    alone = _copy([export / name for name in names], tmp_path / "alone")
    texts = ["a good film", "Café", ""]
    for name in names:
        assert load_predictor(alone / name).predict(texts) == \
            load_predictor(export / name).predict(texts), name
    bare = onnx.load(alone / "model.onnx")
    assert {"model_card.json", "vocab.txt", "labels.txt"} <= {
        entry.key for entry in bare.metadata_props}
    del bare.metadata_props[:]
    onnx.save(bare, alone / "model.onnx")
    with pytest.raises(PredictorError, match=r"model_card\.json is missing: model\.onnx "
                                             "is decoded with the labels"):
        load_predictor(alone / "model.onnx")
    no_vocab = _copy([export / "model.onnx", export / "model_card.json"], tmp_path / "no_vocab")
    with pytest.raises(PredictorError, match=r"vocab\.txt is missing \(model\.onnx is decoded "
                                             "with .*: an export directory gets it from "
                                             "`keras-attn export RUN --output-dir"):
        load_predictor(no_vocab / "model.onnx")
    # The classifier with the NER export's side files: labels and logits disagree.
    mixed = _copy([export / "model.onnx", ner_export / "model_card.json",
                   ner_export / "vocab.txt"], tmp_path / "mixed")
    with pytest.raises(PredictorError, match=r"outputs logits of shape \[.*\], but its "
                                             "model_card.json describes a ner model"):
        load_predictor(mixed / "model.onnx")
    (mixed / "labels.txt").write_text("a\nb\n")
    with pytest.raises(PredictorError, match="list different labels"):
        load_predictor(mixed / "model.onnx")
    text_mixed = _copy([export / "model_text.tflite", ner_export / "model_card.json"],
                       tmp_path / "text_mixed")
    with pytest.raises(PredictorError, match="is a classification model but its "
                                             "model_card.json says task 'ner'"):
        load_predictor(text_mixed / "model_text.tflite")
    card = json.loads((export / "model_card.json").read_text())
    card["tokenizer"]["vocabulary_size"] += 1
    wrong_vocab = _copy([export / "model_fp32.tflite", export / "vocab.txt"], tmp_path / "wv")
    (wrong_vocab / "model_card.json").write_text(json.dumps(card))
    with pytest.raises(PredictorError, match=r"vocab\.txt has \d+ tokens but .* says \d+"):
        load_predictor(wrong_vocab / "model_fp32.tflite")
    run_copy = _copy([classification[0] / "model.keras"], tmp_path / "run_copy")
    with pytest.raises(PredictorError, match=r"config\.json is missing \(model\.keras is read "
                                             r"with its run directory's files\): a run directory "
                                             r"gets it from `keras-attn train CONFIG"):
        load_predictor(run_copy / "model.keras")
    predictor = load_predictor(export / "model.onnx")
    with pytest.raises(ValueError, match="`texts` must be a list of str"):
        predictor.predict("one text")
    with pytest.raises(ValueError, match=r"Received: texts\[1\] of type int"):
        predictor.predict(["a", 3])
    assert predictor.predict([]) == []


# --- keras-attn predict --------------------------------------------------------------------------


def _lines(text):
    return [line for line in text.splitlines() if line]


def test_cli_prints_labels_for_argument_texts(classification, capsys):
    from keras_attn.cli import main

    _, export = classification
    texts = CLASSIFICATION_TEXTS[:2]
    expected = load_predictor(export / "model_fp32.tflite").predict(texts)
    assert main(["predict", str(export / "model_fp32.tflite"), *texts]) == 0
    lines = _lines(capsys.readouterr().out)
    assert lines == [f"{r['label']} (p={r['probabilities'][r['label']]:.2f})\t{text}"
                     for r, text in zip(expected, texts)]


def test_cli_reads_a_file_and_notes_skipped_lines(classification, tmp_path, capsys):
    from keras_attn.cli import main

    _, export = classification
    path = tmp_path / "texts.txt"
    path.write_text("the film was good\n\n  \nBad plot.\n", encoding="utf-8")
    assert main(["predict", str(export / "model.onnx"), "--file", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    records = [json.loads(line) for line in _lines(captured.out)]
    assert [(r["line"], r["text"]) for r in records] == [(1, "the film was good"),
                                                         (4, "Bad plot.")]
    expected = load_predictor(export / "model.onnx").predict(["the film was good", "Bad plot."])
    assert [{k: r[k] for k in ("label", "probabilities")} for r in records] == expected
    assert f"{path}:2: empty line skipped" in captured.err
    assert f"{path}:3: empty line skipped" in captured.err


def test_cli_reads_stdin_and_prints_entities(random_tagger, monkeypatch, capsys):
    from keras_attn.cli import main

    _, _, _, path = random_tagger
    texts = NER_TEXTS[:2]
    expected = load_predictor(path).predict(texts)
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(t + "\n" for t in texts)))
    assert main(["predict", str(path)]) == 0
    lines = []
    for text, result in zip(texts, expected):
        lines.append(text)
        lines += [f"  {e['type']:<6} {e['start']:>4}-{e['end']:<4} {e['text']}"
                  for e in result["entities"]] or ["  (no entities)"]
    assert _lines(capsys.readouterr().out) == [line.rstrip() for line in lines]


@pytest.mark.slow
def test_cli_text_tflite_json_entities(ner, monkeypatch, capsys):
    from keras_attn.cli import main

    _, export = ner
    monkeypatch.setattr("sys.stdin", io.StringIO("the film\nanna was in paris\n"))
    assert main(["predict", str(export / "model_text.tflite"), "--json"]) == 0
    records = [json.loads(line) for line in _lines(capsys.readouterr().out)]
    assert [r["line"] for r in records] == [1, 2]
    assert records[0]["entities"] == []
    assert records[1]["entities"] == [
        {"type": "PER", "start": 0, "end": 4, "text": "anna"},
        {"type": "LOC", "start": 12, "end": 17, "text": "paris"}]
    assert [w["tag"] for w in records[1]["words"]] == ["B-PER", "O", "O", "B-LOC"]


def test_cli_errors(classification, tmp_path, monkeypatch, capsys):
    from keras_attn.cli import main

    _, export = classification
    (tmp_path / "blank.txt").write_text("\n \n")
    cases = [
        (["predict", str(export), "a", "--file", str(tmp_path / "blank.txt")],
         "give texts as arguments or --file PATH, not both"),
        (["predict", str(export), "good", " "], "TEXT argument 2 is empty"),
        (["predict", str(export), "--file", str(tmp_path / "blank.txt")],
         "blank.txt holds no text"),
        (["predict", str(export), "--file", str(tmp_path / "none.txt")], "none.txt: no such file"),
        (["predict", str(tmp_path / "model.bin"), "good"], "does not exist"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "keras-attn predict: error:" in err and message in err, err
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["predict", str(export)]) == 2
    assert "<stdin> holds no text" in capsys.readouterr().err


def test_cli_bad_artifacts_and_inputs_are_errors_without_traceback(classification, tmp_path,
                                                                     monkeypatch, capsys):
    """Each case printed a traceback (or changed the text silently) before."""
    from keras_attn.cli import main

    run, export = classification
    broken_onnx = tmp_path / "onnx"
    broken_onnx.mkdir()
    for name in ("model_card.json", "vocab.txt"):
        shutil.copy(export / name, broken_onnx / name)
    (broken_onnx / "model.onnx").write_bytes(np.random.default_rng(0).bytes(2000))
    broken_saved_model = tmp_path / "saved_model"
    shutil.copytree(export / "saved_model", broken_saved_model)
    (broken_saved_model / "saved_model.pb").write_bytes(b"\x08\x01garbage" * 50)
    # Files cut short (as a killed writer of an older version could leave them).
    truncated = tmp_path / "truncated"
    shutil.copytree(export, truncated, ignore=shutil.ignore_patterns("saved_model", "qat"))
    for name in ("model_fp32.tflite", "model.onnx"):
        (truncated / name).write_bytes((export / name).read_bytes()[:5000])
    truncated_run = tmp_path / "truncated_run"
    shutil.copytree(run, truncated_run, ignore=shutil.ignore_patterns("export", "checkpoints"))
    (truncated_run / "model.keras").write_bytes((run / "model.keras").read_bytes()[:3000])
    cases = [
        (["predict", str(broken_onnx / "model.onnx"), "good"],
         f"{broken_onnx / 'model.onnx'}: onnxruntime cannot load it"),
        (["predict", str(truncated / "model_fp32.tflite"), "good"],
         f"{truncated / 'model_fp32.tflite'}: LiteRT cannot load it"),
        (["predict", str(truncated / "model.onnx"), "good"],
         f"{truncated / 'model.onnx'}: onnxruntime cannot load it"),
        (["predict", str(truncated_run), "good"],
         f"{truncated_run / 'model.keras'} is damaged or not a Keras model"),
        (["predict", str(broken_saved_model), "good"],
         f"{broken_saved_model}: TensorFlow cannot load this SavedModel"),
        (["predict", str(export), "--file", str(tmp_path)], f"{tmp_path}: is a directory"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("keras-attn predict: error:") and message in err, err
        assert "Traceback" not in err
    monkeypatch.setattr("sys.stdin", None)  # started with stdin closed (`<&-`)
    assert main(["predict", str(export)]) == 2
    assert "stdin is closed; give texts as arguments or --file" in capsys.readouterr().err
    binary = b"good\n\xff\xfe" + bytes(range(256)) * 160 + b"\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(binary)))
    assert main(["predict", str(export)]) == 2
    err = capsys.readouterr().err
    assert "<stdin>:2: invalid UTF-8 at byte 0 of the line" in err and len(err) < 400, err
    # A byte-order mark on stdin is dropped, as it is with --file.
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbfgood\n")))
    assert main(["predict", str(export), "--json"]) == 0
    (record,) = [json.loads(line) for line in _lines(capsys.readouterr().out)]
    assert record["text"] == "good" and record["line"] == 1


def test_num_threads_is_checked_before_the_path():
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match=rf"`num_threads` must be an integer >= 1 or None\. "
                                             rf"Received: num_threads={bad!r}"):
            load_predictor("nowhere/model.onnx", num_threads=bad)
