"""Fixed-length vs length-bucketed TFLite latency over the real lengths of a data set.

    python benchmarks/tflite_bucket_latency.py RUN_DIR --data /work/shared/data/sst2/dev.tsv \\
        --sequence-length 64 [--qat-run RUN_DIR/export/qat] [--examples 200] [--out DIR]

Converts the run's model (and the QAT run's, for `int8`) twice at `--sequence-length`: one
signature (`model_<variant>.tflite`) and one signature per length bucket
(`model_<variant>_buckets.tflite`, `bucket_lengths`), tokenizes `--examples` texts sampled at
random from `--data` (a CoNLL-2003 file: sentences joined by spaces; else a TSV with a
`sentence` column) with the run's tokenizer, and times the two files on them interleaved
(`keras_attn.export.length_buckets.bucket_latency`, 1 thread). Prints the CPU, the file
sizes, the argmax agreement of the two files (per text, or per real token for a tagger)
and their max |Δlogit|, and
p50 / mean latency with their ratios, as a markdown table.
"""

import argparse
import os
import tempfile

import numpy as np

from keras_attn.export.length_buckets import bucket_latency
from keras_attn.export.tflite.tflite_export import bucket_lengths
from keras_attn.export.tflite.tflite_export import export_tflite
from keras_attn.export.tflite.tflite_runtime import run_tflite
from keras_attn.machine import cpu_description
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.conll_reader import ConllReader


def _texts(path, count, seed=0):
    if path.endswith(".txt"):
        texts = [" ".join(sentence.tokens) for sentence in ConllReader(path)]
    else:
        texts = [example.text for example in ClassificationReader(path, text_column="sentence",
                                                                  label_column="label")]
    rng = np.random.default_rng(seed)
    return [texts[i] for i in sorted(rng.choice(len(texts), min(count, len(texts)),
                                                replace=False))]


def _convert(run, qat_run, length, out, calibration, variants):
    paths = {}
    for buckets in (None, bucket_lengths(length)):
        results = {}
        float_variants = [v for v in variants if v != "int8"]
        if float_variants:
            results = export_tflite(run.load_model(), out, float_variants, length,
                                    buckets=buckets)
        if qat_run is not None and "int8" in variants:
            results.update(export_tflite(RunDirectory(qat_run).load_model(), out, ["int8"],
                                         length, calibration, buckets=buckets))
        for variant, result in results.items():
            paths.setdefault(variant, []).append(result)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--data", required=True)
    parser.add_argument("--sequence-length", type=int, required=True)
    parser.add_argument("--qat-run")
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--out", help="where the .tflite files go (default: a temporary dir)")
    parser.add_argument("--variants", nargs="+", default=["fp32", "dynamic_int8", "int8"],
                        choices=["fp32", "dynamic_int8", "int8"],
                        help="int8 needs --qat-run")
    args = parser.parse_args(argv)
    run = RunDirectory(args.run_dir)
    tokenizer = run.tokenizer(args.sequence_length)
    packed = tokenizer(_texts(args.data, args.examples))
    inputs = [{name: np.asarray(packed[name][i:i + 1], "int32")
               for name in ("token_ids", "segment_ids", "padding_mask")}
              for i in range(len(packed["token_ids"]))]
    tokens = [int(x["padding_mask"].sum()) for x in inputs]
    out = args.out or tempfile.mkdtemp(prefix="bucket_latency_")
    paths = _convert(run, args.qat_run, args.sequence_length, out, inputs[:32],
                     args.variants)
    print(f"CPU: {cpu_description()}, 1 thread; {os.path.basename(args.data)}: {len(inputs)} "
          f"texts, tokens median {np.median(tokens):.0f}, mean {np.mean(tokens):.1f}; "
          f"length {args.sequence_length}, buckets {bucket_lengths(args.sequence_length)}\n")
    print("| variant | fixed MB | buckets MB | argmax agreement | max \\|Δlogit\\| | "
          "fixed p50 / mean ms | buckets p50 / mean ms | p50 ratio | mean ratio |")
    print("| --- " * 9 + "|")
    batch = {name: np.concatenate([x[name] for x in inputs]) for name in inputs[0]}
    real = batch["padding_mask"].astype(bool)
    for variant, (fixed, bucketed) in paths.items():
        a, b = run_tflite(fixed["path"], batch), run_tflite(bucketed["path"], batch)
        same = a.argmax(-1) == b.argmax(-1)
        agreement = same[real].mean() if same.ndim == 2 else same.mean()
        delta = np.abs(a - b)[real].max() if same.ndim == 2 else np.abs(a - b).max()
        latency = bucket_latency(fixed["path"], bucketed["path"], inputs)
        print(f"| {variant} | {fixed['size_bytes'] / 1e6:.2f} | "
              f"{bucketed['size_bytes'] / 1e6:.2f} | {agreement:.4f} | {delta:.1e} | "
              f"{latency['fixed']['p50_ms']:.2f} / {latency['fixed']['mean_ms']:.2f} | "
              f"{latency['bucketed']['p50_ms']:.2f} / {latency['bucketed']['mean_ms']:.2f} | "
              f"{latency['p50_ratio']:.2f}× | {latency['mean_ratio']:.2f}× |", flush=True)
    print(f"\nbucket counts: {latency['bucket_counts']}")


if __name__ == "__main__":
    main()
