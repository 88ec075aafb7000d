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

`--instructions` counts instead of timing, on the CPU without its AVX-512 and VNNI:

    python benchmarks/tflite_interleaved_latency.py --instructions --sequence-length 64 \\
        export/model_fp32.tflite export/model_dynamic_int8.tflite export/model_int8.tflite

Each model runs in a child process under valgrind's callgrind (Debian's `valgrind`), once with
one inference and once with `1 + --runs`; the difference over `--runs` is the instructions of
one inference, without start-up, loading and XNNPACK's weight packing. valgrind implements no
AVX-512 instruction and presents a CPU with AVX2 and FMA only, so XNNPACK picks its AVX2
kernels: the AVX2 kind of CPU (int8 without dot-product instructions), measured on any
x86 machine. The table names the kernels with the most instructions per model, which shows
the kernel family picked (`fma3`, `avx2`, never `avx512`). Instructions are not time (an
AVX2 int8 multiply-add takes more instructions than an fp32 one but each is cheaper), so the
counts rank files on that kind, they do not give its milliseconds; the count of one binary,
model and input is the same on every run, whatever else the machine is doing.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from keras_attn.export.tflite.tflite_float_ops import xnnpack_partitions
from keras_attn.export.tflite.tflite_runtime import default_signature_key
from keras_attn.export.tflite.tflite_runtime import default_signature_runner
from keras_attn.machine import cpu_description


def model_runner(path, sequence_length, threads):
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
    runners = {path: model_runner(path, sequence_length, threads) for path in paths}
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


# The process callgrind runs: LiteRT and numpy only (TensorFlow's import would take minutes
# under valgrind). argv: model, .npz of its inputs, signature key, inferences.
_INFERENCES = """
import sys
import numpy as np
from ai_edge_litert.interpreter import Interpreter
path, inputs, key, count = sys.argv[1], np.load(sys.argv[2]), sys.argv[3], int(sys.argv[4])
runner = Interpreter(model_path=path, num_threads=1).get_signature_runner(key)
for _ in range(count):
    runner(**inputs)
"""


def _callgrind(arguments, directory):
    """Instructions per function of `_INFERENCES` run with `arguments` under callgrind."""
    out_file = os.path.join(directory, "callgrind.out")
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
               sys.executable, "-c", _INFERENCES, *arguments]
    # One BLAS thread (numpy's idle OpenBLAS threads would add instructions of their own)
    # and one string hash seed, so that the same run counts the same instructions.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0")
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"valgrind on {arguments[0]} exited with {done.returncode}:\n{tail}")
    return _annotate(out_file)


_ANNOTATE_LINE = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+(.+?)(?: \[.*\])?$")


def function_counts(annotate_output):
    """`{function: instructions}` and the program total from `callgrind_annotate` text."""
    counts = {}
    for line in annotate_output.splitlines():
        match = _ANNOTATE_LINE.match(line)
        if match:
            name = match.group(2).rsplit(":", 1)[-1].strip()
            counts[name] = counts.get(name, 0) + int(match.group(1).replace(",", ""))
    return counts


def _annotate(out_file):
    done = subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no", out_file],
                          capture_output=True, text=True, check=True)
    return function_counts(done.stdout)


def count_instructions(path, sequence_length, runs, directory):
    """Instructions of one inference of `path` and `{kernel: instructions}` per inference
    of its XNNPACK kernels, from two callgrind runs (1 and `1 + runs` inferences)."""
    _, inputs = model_runner(path, sequence_length, 1)
    inputs_file = os.path.join(directory, "inputs.npz")
    np.savez(inputs_file, **inputs)
    key = default_signature_key(Interpreter(model_path=path))
    one, more = (_callgrind([path, inputs_file, key, str(n)], directory) for n in (1, 1 + runs))
    per_inference = {name: (more[name] - one.get(name, 0)) / runs for name in more}
    kernels = {name: n for name, n in per_inference.items() if name.startswith("xnn_")}
    return per_inference["PROGRAM TOTALS"], kernels


def instruction_table(counts, top=2):
    """Markdown rows: model, instructions per inference, ratio to the first model and the
    `top` XNNPACK kernels with the most instructions."""
    paths = list(counts)
    base = counts[paths[0]][0]
    lines = ["| model | instructions per inference | × first | top XNNPACK kernels |",
             "| --- | ---: | ---: | --- |"]
    for path in paths:
        total, kernels = counts[path]
        names = sorted(kernels, key=kernels.get, reverse=True)[:top]
        shown = ", ".join(f"`{name}` {kernels[name] / total:.0%}" for name in names)
        lines.append(f"| `{path}` | {total / 1e6:,.1f} M | {total / base:.2f} | {shown} |")
    return "\n".join(lines)


def _instructions(args):
    print("Instructions (valgrind callgrind; the CPU seen has AVX2 and FMA, no AVX-512 or "
          f"VNNI), 1 thread, on {cpu_description()}\n")
    with tempfile.TemporaryDirectory() as directory:
        counts = {path: count_instructions(path, args.sequence_length, args.runs, directory)
                  for path in args.models}
    print(instruction_table(counts))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", help="TFLite files; the first is the baseline")
    parser.add_argument("--sequence-length", type=int, required=True,
                        help="the models' fixed input length")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30, help="inferences per model per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per inference under valgrind (no AVX-512, no "
                             "VNNI) instead of timing; --runs inferences are counted")
    args = parser.parse_args(argv)
    for name in ("sequence_length", "rounds", "runs", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1. "
                         f"Received: {getattr(args, name)}")
    if args.instructions:
        return _instructions(args)
    # int8 speed depends on the CPU's VNNI (and bf16 on AVX-512 BF16): name it with the table.
    print(f"CPU: {cpu_description()}, {args.threads} thread(s)\n")
    times = measure(args.models, args.sequence_length, args.rounds, args.runs, args.threads)
    print(table(times, {path: xnnpack_partitions(path, args.threads) for path in args.models}))


if __name__ == "__main__":
    main()
