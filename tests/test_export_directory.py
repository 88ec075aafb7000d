"""`ExportDirectory` and `ModelCard`: the one reader of an export's card, vocabulary and
labels; its errors name the file and the command that writes it."""

import json

import numpy as np
import pytest

from keras_attn.errors import KerasAttnError
from keras_attn.runs import ExportDirectory
from keras_attn.runs import ExportDirectoryError
from keras_attn.runs import ModelCard

pytestmark = pytest.mark.tensorflow  # the tokenizer is tf-text

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film"]


def card(**overrides):
    values = {"task": "classification", "labels": ["neg", "pos"], "sequence_length": 8,
              "tokenizer": {"vocabulary_size": len(VOCAB), "lowercase": True,
                            "strip_accents": True}, "crf": None, "source_run": "/runs/a"}
    values.update(overrides)
    return values


def write_export(path, values=None, vocab=VOCAB, labels=("neg", "pos")):
    export = ExportDirectory(path)
    export.write_card(values or card())
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    if labels is not None:
        (path / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    return export


def test_model_card_reads_card_vocabulary_and_labels(tmp_path):
    export = write_export(tmp_path)
    assert export.is_export() and not export.is_finished()
    model_card = export.model_card()
    assert model_card.task == "classification" and model_card.sequence_length == 8
    assert list(model_card.label_vocabulary().labels) == ["neg", "pos"]
    tokenizer = model_card.tokenizer()
    assert tokenizer.sequence_length == 8 and tokenizer.vocabulary_size() == len(VOCAB)
    ids = np.asarray(tokenizer(["Good film"])["token_ids"])[0]
    assert ids.tolist() == [2, 5, 7, 3, 0, 0, 0, 0]  # [CLS] good film [SEP], lower-cased
    assert model_card.crf() is None
    assert export.source_run() == "/runs/a"


def test_missing_file_names_it_and_the_command(tmp_path):
    export = ExportDirectory(tmp_path / "nothing")
    with pytest.raises(ExportDirectoryError) as error:
        export.model_card("predicting")
    message = str(error.value)
    assert "model_card.json is missing (predicting)" in message
    assert f"keras-attn export RUN --output-dir {tmp_path / 'nothing'}" in message
    assert isinstance(error.value, KerasAttnError) and isinstance(error.value, ValueError)


@pytest.mark.parametrize("values, vocab, labels, match", [
    (card(labels=["neg", "pos", "mixed"]), VOCAB, ("neg", "pos"), "list different labels"),
    (card(task="mlm"), VOCAB, ("neg", "pos"), "not a keras-attn model card"),
    ({"task": "classification", "labels": ["neg", "pos"]}, VOCAB, None, "missing"),
])
def test_inconsistent_files_are_refused(tmp_path, values, vocab, labels, match):
    export = write_export(tmp_path, values, vocab, labels)
    with pytest.raises(ExportDirectoryError, match=match):
        export.model_card()


def test_a_missing_vocabulary_is_an_error_only_for_the_tokenizer(tmp_path):
    export = write_export(tmp_path)
    (tmp_path / "vocab.txt").unlink()
    model_card = export.model_card("decoding model_text.tflite")  # text in: no vocabulary
    assert model_card.vocabulary is None and model_card.task == "classification"
    with pytest.raises(ExportDirectoryError, match=r"vocab.txt is missing \(decoding "
                                                   r"model_text.tflite\): an export directory"):
        model_card.tokenizer()


def test_a_vocabulary_of_another_export_is_refused(tmp_path):
    export = write_export(tmp_path, vocab=VOCAB[:-1])
    with pytest.raises(ExportDirectoryError, match=r"has 7 tokens but model_card.json says 8 "
                                                   r"\(tokenizer.vocabulary_size\)"):
        export.model_card().tokenizer()


def test_damaged_card_names_the_file(tmp_path):
    write_export(tmp_path)
    (tmp_path / "model_card.json").write_text('{"task": ', encoding="utf-8")
    with pytest.raises(ExportDirectoryError, match=r"model_card.json is damaged: not a JSON "
                                                   r"file .*re-run `keras-attn export`"):
        ExportDirectory(tmp_path).card()


def test_crf_weights_and_the_artifact_list(tmp_path):
    crf = {"transitions": [[0.5, -1.0], [0.0, 2.0]], "start_transitions": [1.0, 0.0],
           "end_transitions": [0.0, -0.5]}
    artifacts = [{"file": "model_int8.tflite", "kind": "tflite", "precision": "int8",
                  "lengths": [8]}]
    export = write_export(tmp_path, card(task="ner", labels=["O", "B-LOC"], crf=crf,
                                         artifacts=artifacts), labels=("O", "B-LOC"))
    weights = export.model_card().crf()
    np.testing.assert_array_equal(weights.transitions, np.float32(crf["transitions"]))
    assert weights.end_transitions.dtype == np.float32
    assert export.artifacts() == artifacts


def test_a_card_without_the_artifact_list_says_to_export_again(tmp_path):
    export = write_export(tmp_path)
    with pytest.raises(ExportDirectoryError, match="predates the artifact list: re-run"):
        export.artifacts()


def test_the_report_is_written_last_and_marks_a_finished_export(tmp_path):
    export = write_export(tmp_path)
    export.write_report({"task": "classification"}, "# report\n")
    assert export.is_finished()
    assert export.report() == {"task": "classification"}
    assert (tmp_path / "export_report.md").read_text(encoding="utf-8") == "# report\n"


def test_embedded_copies_are_read_into_the_same_model_card():
    model_card = ModelCard(card(), VOCAB, ["neg", "pos"], source="model.tflite")
    assert model_card.tokenizer().vocabulary_size() == len(VOCAB)
    assert json.loads(json.dumps(model_card.card)) == card()
