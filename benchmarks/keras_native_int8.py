"""Keras' own int8 (`model.quantize("int8")`) against our recipe's `model_int8.tflite`.

Usage:
    python benchmarks/keras_native_int8.py RUN_DIR EXPORT_DIR --data sst2|conll2003
        [--labels 0=negative,1=positive] [--limit N] [--latency-texts N]

Loads the float model of a `keras-attn train` run (`RUN_DIR/model.keras`), scores it, then
the same model after `model.quantize("int8")` (Keras-native: int8 weights, activations
quantized on the fly, run by Keras on TensorFlow), and our export's full-int8
`EXPORT_DIR/model_int8.tflite` (QAT, LiteRT), on SST-2 dev (accuracy) or CoNLL-2003 test
(strict entity F1), scored as `benchmarks/web_accuracy.py` scores them. Reports for each:
the score, the agreement with the float model, the weight bytes (Keras: the variables'
bytes; LiteRT: the file) and the per-sentence latency p50 over `--latency-texts` sentences
one at a time, the three timed in turns, 1 thread (TensorFlow's intra/inter-op threads and
LiteRT both at 1).
Prints a Markdown table. Data is read in place from `../shared/data`
(`KERAS_ATTN_SHARED_DATA`).
"""

import argparse
import importlib.util
import pathlib
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

from keras_attn.stages.inference.predictor import load_predictor  # noqa: E402

_SPEC = importlib.util.spec_from_file_location(
    "web_accuracy", pathlib.Path(__file__).with_name("web_accuracy.py"))
web_accuracy = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(web_accuracy)


def weight_bytes(model):
    return sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in model.weights)


def latencies_ms(predictors, texts):
    """p50 of one-sentence predictions per predictor, timed in turns (each sentence through
    every predictor before the next), so load on the machine hits them alike."""
    times = [[] for _ in predictors]
    for predictor in predictors:
        predictor.predict(texts[:1])  # warm-up
    for text in texts:
        for i, predictor in enumerate(predictors):
            start = time.perf_counter()
            predictor.predict([text])
            times[i].append(time.perf_counter() - start)
    return [1000 * float(np.median(t)) for t in times]


def evaluate(name, predictor, texts, gold, label_map, reference, size):
    results = predictor.predict(texts)
    agreement = None if reference is None else float(np.mean(
        [web_accuracy.same(a, b) for a, b in zip(results, reference)]))
    row = {"artifact": name, **web_accuracy.score(args.data, results, gold, label_map),
           "agreement": agreement, "MB": size / 1e6}
    print(row, flush=True)
    return results, row


def main():
    texts, gold = web_accuracy.load_set(args.data, args.limit)
    label_map = dict(pair.split("=") for pair in args.labels.split(",")) if args.labels else {}
    keras_float, keras_int8 = load_predictor(args.run_dir), load_predictor(args.run_dir)
    keras_int8.model.quantize("int8")
    tflite = pathlib.Path(args.export_dir) / "model_int8.tflite"
    ours = load_predictor(tflite, num_threads=1)
    reference, float_row = evaluate("Keras float32", keras_float, texts, gold, label_map, None,
                                    weight_bytes(keras_float.model))
    _, keras_row = evaluate('Keras `model.quantize("int8")`', keras_int8, texts, gold,
                            label_map, reference, weight_bytes(keras_int8.model))
    _, ours_row = evaluate("ours: model_int8.tflite (QAT, LiteRT)", ours, texts, gold,
                           label_map, reference, tflite.stat().st_size)
    rows = (float_row, keras_row, ours_row)
    for row, ms in zip(rows, latencies_ms((keras_float, keras_int8, ours),
                                          texts[:args.latency_texts])):
        row["p50 ms"] = ms
    metric = "accuracy" if args.data == "sst2" else "f1"
    print(f"\n| {args.data} | {metric} | agreement with float | MB | p50 ms, 1 thread |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        agreement = "" if row["agreement"] is None else f"{row['agreement']:.4f}"
        print(f"| {row['artifact']} | {row[metric]:.4f} | {agreement} | {row['MB']:.1f} | "
              f"{row['p50 ms']:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("export_dir")
    parser.add_argument("--data", choices=("sst2", "conll2003"), required=True)
    parser.add_argument("--labels", default="")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--latency-texts", type=int, default=50)
    args = parser.parse_args()
    main()
