"""The export's length-bucketed TFLite files and their latency over real input lengths.

A fixed-length model makes every input pay for the longest one: at length 128, a 20-token
sentence runs 108 padding positions through every layer. `model_<variant>_buckets.tflite`
(`keras_attn.export.tflite.tflite_export`, `buckets=bucket_lengths(L)`) holds one signature per
length bucket (16, 24, 32, 48, 64, ... and `L`) over one copy of the weights, and each input runs on
the shortest bucket that holds its tokens (`BucketedTFLite`). They are written beside the
fixed-length files, which keep their one-signature contract (MediaPipe, apps and tools that
run the only signature).

`bucket_latency` times the fixed and the bucketed file on the same real inputs, interleaved
(each input runs on one, then on the other, so a busy moment of a shared machine hits both),
and gives p50 and mean over the inputs: the latency of the evaluation set's real length
distribution.
"""

import time

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from keras_attn.export.tflite.tflite_runtime import BucketedTFLite
from keras_attn.export.tflite.tflite_runtime import default_signature_runner

# The variants written with buckets: float, and the two int8 files apps use.
BUCKET_VARIANTS = ("fp32", "dynamic_int8", "int8")
LATENCY_EXAMPLES = 200


def bucketed_file_name(variant):
    """`model_<variant>_buckets.tflite`."""
    return f"model_{variant}_buckets.tflite"


def _time(call):
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1000.0


def bucket_latency(fixed_path, bucketed_path, inputs, num_threads=1, warmup=3):
    """Latency of a fixed-length file and its bucketed twin over real inputs, interleaved.

    Args:
        fixed_path: the one-signature `.tflite` file.
        bucketed_path: the file with length buckets.
        inputs: list of dicts of `(1, L)` int32 arrays (real examples padded to `L`).
        num_threads: LiteRT threads (XNNPACK).
        warmup: runs of every bucket before timing.

    Returns:
        Dict: `fixed` and `bucketed` `{"p50_ms", "mean_ms"}`, their `p50_ratio` and
        `mean_ratio` (bucketed / fixed), `examples`, `num_threads` and `bucket_counts`
        {bucket length: inputs run on it}.
    """
    fixed = default_signature_runner(Interpreter(model_path=str(fixed_path),
                                                 num_threads=num_threads))
    bucketed = BucketedTFLite(Interpreter(model_path=str(bucketed_path),
                                          num_threads=num_threads))
    for x in inputs[:warmup]:
        fixed(**x)
    for length in bucketed.lengths:  # every bucket's first run (allocation) untimed
        runner, names = bucketed.runners[length]
        for _ in range(warmup):
            runner(**{name: inputs[0][name][:, :length] for name in names})
    times = {"fixed": [], "bucketed": []}
    counts = {}
    for x in inputs:
        times["fixed"].append(_time(lambda: fixed(**x)))
        times["bucketed"].append(_time(lambda: bucketed(x)))
        tokens = int(np.flatnonzero(x["padding_mask"][0])[-1]) + 1
        counts[bucketed.bucket(tokens)] = counts.get(bucketed.bucket(tokens), 0) + 1
    result = {name: {"p50_ms": round(float(np.median(t)), 3),
                     "mean_ms": round(float(np.mean(t)), 3)} for name, t in times.items()}
    for statistic in ("p50", "mean"):
        result[f"{statistic}_ratio"] = round(result["bucketed"][f"{statistic}_ms"]
                                             / result["fixed"][f"{statistic}_ms"], 3)
    return {**result, "examples": len(inputs), "num_threads": num_threads,
            "bucket_counts": {str(k): v for k, v in sorted(counts.items())}}


def buckets_markdown(section):
    """Report lines of the export's `length_buckets` section (empty without it)."""
    if not section or not section.get("latency"):
        return []
    lines = ["", "## Length buckets", "",
             f"`model_<variant>_buckets.tflite`: signatures of lengths {section['lengths']} "
             "(`serving_default` = the longest), each input on the shortest that holds its "
             f"tokens. Latency over {section['examples']} evaluation examples sampled at "
             f"random (their real lengths: median {section['tokens_p50']:.0f}, mean "
             f"{section['tokens_mean']:.1f} tokens; per bucket {section['bucket_counts']}), "
             "fixed and bucketed file timed interleaved, "
             f"{section['num_threads']} thread; {section['cpu']}.", "",
             "| variant | fixed p50 / mean ms | bucketed p50 / mean ms | p50 ratio | mean ratio |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for variant, row in section["latency"].items():
        lines.append(
            f"| `{variant}` | {row['fixed']['p50_ms']:.2f} / {row['fixed']['mean_ms']:.2f} | "
            f"{row['bucketed']['p50_ms']:.2f} / {row['bucketed']['mean_ms']:.2f} | "
            f"{row['p50_ratio']:.2f}× | {row['mean_ratio']:.2f}× |")
    return lines
