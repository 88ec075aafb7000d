"""`keras-attn explain`: attention maps against a numpy BERT, the PNG, run loading, CLI."""

import json
import math
import sys

import keras
import matplotlib.image
import numpy as np
import pytest

from keras_attn import cli
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.models.gpt_backbone import GPTBackbone
from keras_attn.stages.explain import ExplainError
from keras_attn.stages.explain import attention_maps
from keras_attn.stages.explain import explain
from keras_attn.stages.explain import load_explained_model
from keras_attn.text.entity_prediction import predict_entities
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.visualization import plot_attention_grid
from keras_attn.visualization import plot_position_embeddings
from tests.numpy_reference import mha_weights
from tests.numpy_reference import np_ffn
from tests.numpy_reference import np_layer_norm
from tests.numpy_reference import np_mha
from tests.test_bert_backbone import np_gelu
from tests.test_bert_backbone import randomized_backbone
from tests.test_bert_backbone import tiny_inputs
from tests.test_trainer import config_dict
from tests.test_trainer import write_data

pytestmark = pytest.mark.tensorflow  # tokenizer (tf-text) and the training run

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was", "very", "good",
         "bad", "paris", "anna", "in", "rome", "##s", ",", "."]
NER_LABELS = ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
LENGTH = 12


# --- numpy reference ---------------------------------------------------------------------


def numpy_attention(model, inputs):
    """(L, B, H, S, S) probabilities from the weights alone: the paper's formulas in numpy,
    softmax(q k^T / sqrt(d_k)) over the real keys, through a numpy BERT."""
    def table(layer):
        return keras.ops.convert_to_numpy(layer.embeddings).astype("float64")

    embeddings = model.get_layer("embeddings")
    ids, segments = inputs["token_ids"], inputs["segment_ids"]
    length = ids.shape[1]
    x = (table(embeddings.token_embedding)[ids] + table(embeddings.segment_embedding)[segments]
         + table(embeddings.position_embedding)[:length])
    x = np_layer_norm(x, model.get_layer("embeddings_layer_norm"))
    result = np.zeros((model.num_layers, len(ids), model.num_heads, length, length))
    for b in range(len(ids)):
        h = x[b]
        keys = np.asarray(inputs["padding_mask"][b]).astype(bool)
        mask = np.broadcast_to(keys[None, :], (length, length))
        for layer, block in enumerate(model.transformer_layers):
            w = mha_weights(block.self_attention)
            (wq, bq), (wk, bk) = w["q"], w["k"]
            for head in range(model.num_heads):
                q = h @ wq[:, head] + bq[head]  # (S, dk)
                k = h @ wk[:, head] + bk[head]  # (S, dk)
                scores = q @ k.T / math.sqrt(q.shape[1])  # (S, S)
                scores = np.where(mask, scores, -np.inf)
                e = np.exp(scores - scores.max(-1, keepdims=True))
                result[layer, b, head] = e / e.sum(-1, keepdims=True)
            h = np_layer_norm(h + np_mha(h, h, w, mask), block.self_attention_layer_norm)
            h = np_layer_norm(h + np_ffn(h, block, np_gelu), block.feedforward_layer_norm)
    return result


# --- attention_maps --------------------------------------------------------------------------


@pytest.mark.parametrize("wrapper", ["backbone", "classifier", "crf_tagger"])
def test_attention_maps_equal_numpy_softmax_of_the_layer_weights(wrapper):
    backbone = randomized_backbone(num_heads=2)
    inputs = tiny_inputs()
    model = {
        "backbone": lambda: backbone,
        "classifier": lambda: BertClassifier(backbone, num_classes=3),
        "crf_tagger": lambda: BertTokenClassifier(backbone, num_labels=4, use_crf=True),
    }[wrapper]()
    if wrapper == "crf_tagger":
        inputs = {**inputs, "label_mask": inputs["padding_mask"]}  # ignored: not attention
    maps = attention_maps(model, inputs)
    expected = numpy_attention(backbone, inputs)
    assert maps.shape == (2, 2, 2, 6, 6) and maps.dtype == np.float32
    np.testing.assert_allclose(maps, expected, atol=2e-5)
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    assert np.all(maps[:, 1, :, :, 4:] == 0.0)  # example 1's two padded keys
    assert maps[:, 0].min() > 0.0  # example 0 has no padding
    assert np.abs(maps[0] - maps[1]).max() > 1e-3  # the layers differ: not one map copied


def test_attention_maps_checks_the_replay_against_the_backbone(monkeypatch):
    backbone = randomized_backbone()
    blocks = backbone.transformer_layers
    # A replay in the wrong order must be caught, not drawn.
    monkeypatch.setattr(BertBackbone, "transformer_layers", property(lambda self: blocks[::-1]))
    with pytest.raises(RuntimeError, match="Replaying the backbone's layers"):
        attention_maps(backbone, tiny_inputs())


def test_attention_maps_rejects_models_without_a_bert_backbone():
    gpt = GPTBackbone(vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
                      intermediate_dim=16, max_sequence_length=8)
    with pytest.raises(ExplainError, match="BertBackbone.*Received: model=GPTBackbone"):
        attention_maps(gpt, tiny_inputs())
    with pytest.raises(ExplainError, match="missing \\['padding_mask'\\]"):
        attention_maps(randomized_backbone(), {"token_ids": np.ones((1, 3), "int32"),
                                               "segment_ids": np.zeros((1, 3), "int32")})


# --- run directories -------------------------------------------------------------------------


def write_run(directory, model, task, labels, lowercase=True):
    """A run directory as training wrote it before tokenizer.json and lineage.json."""
    directory.mkdir(parents=True)
    model.save(directory / "model.keras")
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (directory / "labels.txt").write_text("\n".join(labels) + "\n")
    (directory / "config.json").write_text(json.dumps(
        {"task": task, "data": {"max_length": LENGTH}, "model": {"lowercase": lowercase}}))
    return directory


def copy_run(source, directory, task=None, **files):
    """A copy of the run `source` with another `task` in config.json and extra JSON files."""
    directory.mkdir(parents=True)
    for path in source.iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    config = json.loads((source / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "task": task or
                                                       config["task"]}))
    for name, value in files.items():
        (directory / f"{name}.json").write_text(json.dumps(value))
    return directory


def tiny_backbone(num_layers=2, num_heads=3, seed=0):
    keras.utils.set_random_seed(seed)
    return BertBackbone(vocabulary_size=len(VOCAB), num_layers=num_layers,
                        num_heads=num_heads, hidden_dim=12, intermediate_dim=24,
                        max_sequence_length=16, dropout=0.0)


@pytest.fixture(scope="module")
def classification_run(tmp_path_factory):
    model = BertClassifier(tiny_backbone(), num_classes=3)
    dense = model.get_layer("logits")  # spread the classes so the probabilities differ
    dense.kernel.assign(np.random.default_rng(1).normal(scale=2.0, size=(12, 3)))
    return write_run(tmp_path_factory.mktemp("cls") / "run", model, "classification",
                     ["negative", "neutral", "positive"])


@pytest.fixture(scope="module")
def ner_run(tmp_path_factory):
    model = BertTokenClassifier(tiny_backbone(num_layers=1, num_heads=2, seed=1),
                                num_labels=len(NER_LABELS), use_crf=True)
    dense = model.get_layer("logits")
    dense.kernel.assign(np.random.default_rng(2).normal(scale=3.0, size=(12, 5)))
    return write_run(tmp_path_factory.mktemp("ner") / "run", model, "ner", NER_LABELS)


def test_classification_png_shows_every_layer_and_head_of_the_model(classification_run,
                                                                     tmp_path):
    path = tmp_path / "explain.png"
    summary = explain(classification_run, "Anna was in Paris , very good .", path)
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == summary["image_size"][::-1]
    assert image.std() > 0.05  # not a blank canvas
    assert summary["panels"] == 2 * 3 and summary["layers"] == [0, 1]
    assert summary["heads"] == [0, 1, 2]
    assert summary["tokens"] == ["[CLS]", "anna", "was", "in", "paris", ",", "very", "good",
                                 ".", "[SEP]"]
    # What was drawn is the numpy reference for those pieces.
    loaded = load_explained_model(classification_run)
    ids = np.array([[VOCAB.index(t) for t in summary["tokens"]]], "int32")
    inputs = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
              "padding_mask": np.ones_like(ids)}
    expected = numpy_attention(loaded.model.backbone, inputs)[:, 0]  # (L, H, n, n)
    np.testing.assert_allclose(summary["maps"], expected, atol=2e-5)
    # The prediction is the softmax of the model's logits for those pieces.
    logits = np.asarray(loaded.model(inputs, training=False), "float64")[0]
    probabilities = np.exp(logits) / np.exp(logits).sum()
    reported = summary["prediction"]["probabilities"]
    np.testing.assert_allclose([reported[k] for k in ("negative", "neutral", "positive")],
                               probabilities, atol=1e-5)
    assert summary["prediction"]["label"] == ["negative", "neutral", "positive"][
        int(probabilities.argmax())]


def test_layers_and_heads_select_the_panels(classification_run, tmp_path):
    full = explain(classification_run, "the film was bad", tmp_path / "all.png")
    part = explain(classification_run, "the film was bad", tmp_path / "part.png",
                   layers="1", heads=[2, 0])
    assert part["panels"] == 2 and part["layers"] == [1] and part["heads"] == [0, 2]
    np.testing.assert_array_equal(part["maps"], full["maps"][[1]][:, [0, 2]])
    small = matplotlib.image.imread(tmp_path / "part.png")
    large = matplotlib.image.imread(tmp_path / "all.png")
    assert small.shape[0] < large.shape[0]  # one row of panels instead of two


def test_ner_run_highlights_the_reference_entities(ner_run, tmp_path):
    text = "Anna was in Paris , Rome in Paris"
    summary = explain(ner_run, text, tmp_path / "ner.png")
    loaded = load_explained_model(ner_run)
    reference = predict_entities(loaded.model, loaded.tokenizer,
                                 LabelVocabulary(NER_LABELS), [text])[0]
    assert summary["task"] == "ner"
    assert summary["prediction"]["entities"] == reference["entities"]
    assert reference["entities"]  # the scaled random head finds some entities
    assert summary["panels"] == 2
    assert matplotlib.image.imread(tmp_path / "ner.png").ndim == 3


def test_long_text_is_cut_to_the_run_length_and_said_so(classification_run, tmp_path):
    text = " ".join(["the film was very good"] * 4)  # 20 pieces
    notes = []
    summary = explain(classification_run, text, tmp_path / "long.png", log=notes.append)
    assert len(summary["tokens"]) == LENGTH
    assert summary["num_truncated_pieces"] == 20 - (LENGTH - 2)
    assert any("the last 10 were cut" in note for note in notes), notes


def test_export_directory_resolves_to_its_source_run(classification_run, tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    card = {"source_run": str(classification_run)}
    (export / "model_card.json").write_text(json.dumps(card))
    notes = []
    summary = explain(export, "good film", tmp_path / "e.png", log=notes.append)
    assert summary["run_dir"] == str(classification_run)
    assert any("export directory" in note for note in notes)
    card["source_run"] = str(tmp_path / "deleted_run")
    (export / "model_card.json").write_text(json.dumps(card))
    with pytest.raises(ExplainError, match="pass that training run directory"):
        explain(export, "good film", tmp_path / "e.png")


def test_bad_paths_texts_and_indices_are_explained(classification_run, tmp_path):
    with pytest.raises(ExplainError, match="does not exist"):
        explain(tmp_path / "nowhere", "text", tmp_path / "x.png")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ExplainError, match="not a .keras model"):
        explain(tmp_path / "notes.txt", "text", tmp_path / "x.png")
    with pytest.raises(ExplainError, match="model.keras is missing .*`a finished keras-attn "
                                           "train CONFIG"):
        explain(tmp_path, "text", tmp_path / "x.png")
    with pytest.raises(ExplainError, match="text to explain is empty"):
        explain(classification_run, " \n", tmp_path / "x.png")
    with pytest.raises(ExplainError, match="no word pieces"):
        explain(classification_run, "\u200b\x00", tmp_path / "x.png")
    with pytest.raises(ExplainError, match="from 0 to 1 .*Received: layers=\\[0, 5\\]"):
        explain(classification_run, "good", tmp_path / "x.png", layers="0,5")
    with pytest.raises(ExplainError, match="comma-separated integers"):
        explain(classification_run, "good", tmp_path / "x.png", heads="first")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.keras").write_bytes((classification_run / "model.keras").read_bytes())
    with pytest.raises(ExplainError, match="vocab.txt is missing"):
        explain(broken, "good", tmp_path / "x.png")


def test_the_task_is_the_run_directory_s_not_the_model_class(classification_run, tmp_path,
                                                             capsys):
    # A BertClassifier in a run whose config.json says mlm: attention maps only.
    mlm = copy_run(classification_run, tmp_path / "mlm", task="mlm")
    notes = []
    summary = explain(mlm, "the film was good", tmp_path / "mlm.png", layers="0", heads="0",
                      log=notes.append)
    assert summary["task"] == "mlm" and summary["prediction"] is None
    assert load_explained_model(mlm).labels is None
    assert any("task 'mlm' has no labelled outputs (the classification and ner tasks "
               "have)" in note for note in notes), notes
    assert cli.main(["explain", str(mlm), "good", "--output", str(tmp_path / "c.png"),
                     "--layers", "0", "--heads", "0"]) == 0
    assert f"explain {mlm}: mlm (attention only), 3 tokens" in capsys.readouterr().out
    # A classifier in a run that says ner: the files disagree, and the error says which.
    ner = copy_run(classification_run, tmp_path / "ner", task="ner")
    (ner / "labels.txt").write_text("O\nB-PER\nI-PER\n")  # as many labels as classes
    with pytest.raises(ExplainError, match=r"model.keras \(BertClassifier\) outputs logits "
                                           r"of shape \(None, 3\), but .*config.json says task "
                                           r"'ner', logits \(batch, sequence, labels\)"):
        load_explained_model(ner)
    four = copy_run(classification_run, tmp_path / "four")
    (four / "labels.txt").write_text("a\nb\nc\nd\n")
    with pytest.raises(ExplainError, match="labels.txt lists 4 labels: the files come from "
                                           "different runs"):
        load_explained_model(four)


def test_the_tokenizer_in_effect_is_read_from_tokenizer_json(classification_run, tmp_path):
    # A run continued from an uncased one: its config asked for cased text, but the model
    # reads lower-cased pieces, as tokenizer.json records.
    text = "Anna was in Paris"
    cased = copy_run(classification_run, tmp_path / "cased",
                     tokenizer={"kind": "wordpiece", "lowercase": False, "max_length": LENGTH})
    continued = copy_run(classification_run, tmp_path / "continued",
                         tokenizer={"kind": "wordpiece", "lowercase": True, "max_length": 8})
    config = json.loads((continued / "config.json").read_text())
    config["model"]["lowercase"] = False
    (continued / "config.json").write_text(json.dumps(config))
    def pieces(run):
        tokenizer = load_explained_model(run).tokenizer
        return [VOCAB[i] for i in tokenizer.tokenize([text]).to_list()[0]]

    assert pieces(continued) == ["anna", "was", "in", "paris"]
    assert pieces(cased) == ["[UNK]", "was", "in", "[UNK]"]
    assert load_explained_model(continued).tokenizer.sequence_length == 8


def test_run_directory_errors_name_the_file_and_the_command(classification_run, tmp_path):
    unlabelled = copy_run(classification_run, tmp_path / "unlabelled")
    (unlabelled / "labels.txt").unlink()
    with pytest.raises(ExplainError, match="labels.txt is missing .*`keras-attn train CONFIG "
                                           "of a classification or ner task`"):
        explain(unlabelled, "good", tmp_path / "x.png")
    qat = copy_run(classification_run, tmp_path / "qat", lineage={
        "source": "/runs/float", "source_kind": "run", "source_task": "classification",
        "quantization": {"qat_epochs": 0}})
    with pytest.raises(ExplainError, match="quantization-aware run .*explain the float run "
                                           "it was made from, /runs/float"):
        explain(qat, "good", tmp_path / "x.png")


def test_missing_matplotlib_names_the_extra(classification_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install keras-attn\[docs\]"):
        explain(classification_run, "good", tmp_path / "x.png")


# --- a real training run and the CLI ---------------------------------------------------------


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    from keras_attn.runs.training_config import TrainingConfig
    from keras_attn.stages.train_stage import Trainer

    root = tmp_path_factory.mktemp("trained")
    data = write_data(root / "data", n=32)
    values = config_dict(data, root / "run", epochs=1)
    Trainer(TrainingConfig.from_dict(values)).run()
    return root / "run"


def test_cli_explains_a_trained_run(trained_run, tmp_path, capsys):
    output, pe = tmp_path / "attention.png", tmp_path / "pe.png"
    code = cli.main(["explain", str(trained_run), "the film was good", "--output",
                     str(output), "--heads", "1", "--position-encoding", str(pe)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "prediction:" in out and "(1 heatmaps)" in out
    for path in (output, pe, tmp_path / "pe_learned.png"):
        assert matplotlib.image.imread(path).shape[0] > 100, path


def test_cli_errors_exit_2_with_the_message(classification_run, tmp_path, capsys):
    assert cli.main(["explain", str(tmp_path / "missing"), "text"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["explain", str(classification_run), "good", "--layers", "3",
                     "--output", str(tmp_path / "x.png")]) == 2
    assert "Received: layers=[3]" in capsys.readouterr().err


# --- the plotting helpers --------------------------------------------------------------------


def test_position_embeddings_plot_returns_the_cosine_similarity(tmp_path):
    table = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, -2.0]])
    similarity = plot_position_embeddings(tmp_path / "p.png", table)
    s = 1 / math.sqrt(2)
    np.testing.assert_allclose(similarity, [[1, s, 0], [s, 1, -s], [0, -s, 1]], atol=1e-12)
    assert matplotlib.image.imread(tmp_path / "p.png").ndim == 3


def test_attention_grid_checks_the_map_shape(tmp_path):
    with pytest.raises(ValueError, match="len\\(tokens\\)=2"):
        plot_attention_grid(tmp_path / "g.png", np.zeros((1, 1, 3, 3)), ["a", "b"])
    with pytest.raises(ValueError, match="`row_labels` needs 1 entries"):
        plot_attention_grid(tmp_path / "g.png", np.zeros((1, 1, 2, 2)), ["a", "b"],
                            row_labels=["x", "y"])
