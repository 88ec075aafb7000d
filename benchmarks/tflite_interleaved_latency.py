"""Latency of TFLite models measured interleaved, so that they share the machine's state.

    python benchmarks/tflite_interleaved_latency.py --sequence-length 128 \\
        export/model_fp32.tflite export/model_int8.tflite [--rounds 5] [--runs 30]

The export report times each artifact in one block of runs; on a shared 2-core machine a busy
moment then lands on one artifact only (an fp32 p90 of 31 ms against a p50 of 23.6 once made
int8 look 0.76x fp32). Here every model runs `--runs` batch-1 inferences per round, the
models take turns for `--rounds` rounds (LiteRT with XNNPACK, `--threads` threads), and each
p50 / p90 is over all its rounds; the ratios are to the first model's p50. The last column
counts the pieces XNNPACK runs of each graph (ops it has no kernel for cut it).

Inputs are `token_ids` of one repeated in-vocabulary id, zero `segment_ids` and an all-ones
`padding_mask`, whichever of them the model's signature takes. Prints a markdown table.
"""

import argparse
import time

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from keras_attn.export.tflite_export import default_signature_runner
from keras_attn.export.tflite_float_ops import xnnpack_partitions
from keras_attn.machine import cpu_description


def _runner(path, sequence_length, threads):
    # A file with length buckets runs its full-length signature (`serving_default`); for its
    # latency over real lengths see benchmarks/tflite_bucket_latency.py.
    runner = default_signature_runner(Interpreter(model_path=path, num_threads=threads))
    inputs = {"token_ids": np.full((1, sequence_length), 100, "int32"),
              "segment_ids": np.zeros((1, sequence_length), "int32"),
              "padding_mask": np.ones((1, sequence_length), "int32")}
    names = runner.get_input_details()
    missing = [name for name in names if name not in inputs]
    if missing:
        raise ValueError(f"{path}: inputs {missing} are not token ids, segment ids or a "
                         "padding mask; this benchmark times the id-input artifacts "
                         "(model_*.tflite, not model_text.tflite)")
    return runner, {name: inputs[name] for name in names}


def measure(paths, sequence_length, rounds=5, runs=30, threads=1, warmup=10):
    """`{path: list of ms}` of `rounds` x `runs` inferences per model, taken in turns."""
    runners = {path: _runner(path, sequence_length, threads) for path in paths}
    for runner, inputs in runners.values():
        for _ in range(warmup):
            runner(**inputs)
    times = {path: [] for path in paths}
    for _ in range(rounds):
        for path, (runner, inputs) in runners.items():
            for _ in range(runs):
                start = time.perf_counter()
                runner(**inputs)
                times[path].append((time.perf_counter() - start) * 1000.0)
    return times


def table(times, partitions=None):
    """Markdown rows: model, p50, p90, p50 ratio to the first model (and, given
    `{path: count}`, its XNNPACK partitions)."""
    paths = list(times)
    base = float(np.median(times[paths[0]]))
    extra = " XNNPACK partitions |" if partitions else ""
    lines = ["| model | p50 ms | p90 ms | × first |" + extra,
             "| --- | ---: | ---: | ---: |" + (" ---: |" if partitions else "")]
    for path in paths:
        p50, p90 = float(np.median(times[path])), float(np.percentile(times[path], 90))
        count = f" {partitions[path]} |" if partitions else ""
        lines.append(f"| `{path}` | {p50:.2f} | {p90:.2f} | {p50 / base:.2f} |{count}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", help="TFLite files; the first is the baseline")
    parser.add_argument("--sequence-length", type=int, required=True,
                        help="the models' fixed input length")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30, help="inferences per model per round")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    for name in ("sequence_length", "rounds", "runs", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1. "
                         f"Received: {getattr(args, name)}")
    # int8 speed depends on the CPU's VNNI (and bf16 on AVX-512 BF16): name it with the table.
    print(f"CPU: {cpu_description()}, {args.threads} thread(s)\n")
    times = measure(args.models, args.sequence_length, args.rounds, args.runs, args.threads)
    print(table(times, {path: xnnpack_partitions(path, args.threads) for path in args.models}))


if __name__ == "__main__":
    main()
