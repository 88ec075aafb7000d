"""Why full-int8 and dynamic-int8 TFLite BERTs are barely faster than fp32 on a CPU: the
kernels, measured one at a time.

    python benchmarks/tflite_int8_kernels.py [--sequence-length 48] [--hidden 384]

Two measurements, each on single-op TFLite models converted here (LiteRT with its default
XNNPACK delegate, one thread):

1. GEMM throughput of a Transformer's dense layers (`[S, H] x [H, 4H]` and `[S, H] x [H, H]`)
   as fp32, dynamic-range int8 and full int8: if the int8 GEMM is not faster than the fp32
   one on this CPU, no graph change makes an int8 BERT much faster than fp32.
2. Which ops of a BERT block XNNPACK takes, in fp32 and in full int8 (a model with only that
   op shows a `DELEGATE` node when XNNPACK took it). Every op it leaves to the builtin kernels
   splits the delegated graph and runs in a slower kernel.

Prints a markdown report (and `--output FILE` writes it).
"""

import argparse
import collections
import platform
import time

import numpy as np
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter


def _convert(function, shapes, mode, seed=0):
    rng = np.random.default_rng(seed)
    concrete = tf.function(function, input_signature=[tf.TensorSpec(s, tf.float32)
                                                      for s in shapes])
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [concrete.get_concrete_function()], concrete)
    if mode in ("dynamic_int8", "int8"):
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode == "int8":
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.representative_dataset = lambda: (
            [rng.normal(size=s).astype("float32") for s in shapes] for _ in range(8))
        # int8 in and out: no QUANTIZE / DEQUANTIZE at the edges, the model is the op alone.
        converter.inference_input_type = converter.inference_output_type = tf.int8
    return converter.convert()


def _interpreter(model):
    interpreter = Interpreter(model_content=model, num_threads=1)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], np.ones(detail["shape"], detail["dtype"]))
    return interpreter


def _best_ms(interpreter, runs):
    for _ in range(5):
        interpreter.invoke()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        interpreter.invoke()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def gemm_throughput(sequence_length, hidden, runs):
    """Rows `(shape, mode, ms, GOP/s)` of one dense layer per shape and mode."""
    rng = np.random.default_rng(0)
    rows = []
    for n in (hidden, 4 * hidden):
        kernel = tf.constant(rng.normal(size=(hidden, n)).astype("float32") * 0.05)

        def dense(x, kernel=kernel):
            return tf.matmul(x, kernel)

        for mode in ("fp32", "dynamic_int8", "int8"):
            model = _convert(lambda x: dense(x), [(sequence_length, hidden)], mode)
            ms = _best_ms(_interpreter(model), runs)
            rows.append((f"[{sequence_length}, {hidden}] x [{hidden}, {n}]", mode, ms,
                         2 * sequence_length * hidden * n / ms / 1e6))
    return rows


def block_ops(sequence_length, hidden, heads=6):
    """`{op case: {mode: number of XNNPACK partitions}}` for the ops of a BERT block (0: left
    to the builtin kernels; more than 1: split by ops XNNPACK does not take)."""
    s, h, d = sequence_length, hidden, hidden // heads
    keep = np.arange(s) < s - 8

    def layer_norm(x):
        mean = tf.reduce_mean(x, -1, keepdims=True)
        variance = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + 1e-12)

    cases = {
        "dense (FULLY_CONNECTED)": (lambda x: tf.matmul(x, tf.ones((h, h)) * 0.01), [(s, h)]),
        "layer norm (MEAN, SUB, MUL, RSQRT, ADD)": (layer_norm, [(1, s, h)]),
        "GELU": (lambda x: tf.nn.gelu(x, approximate=False), [(1, s, h)]),
        "QK^T / AV (BATCH_MATMUL)": (lambda a, b: tf.matmul(a, b, transpose_b=True),
                                     [(1, heads, s, d), (1, heads, s, d)]),
        "SOFTMAX": (lambda x: tf.nn.softmax(x, -1), [(1, heads, s, s)]),
        "padding mask as SELECT_V2": (
            lambda x: tf.where(keep, x, -1e9 * tf.ones_like(x)), [(1, heads, s, s)]),
        "padding mask as ADD of a bias": (
            lambda x: x + np.where(keep, 0.0, -1e4).astype("float32"), [(1, heads, s, s)]),
        "head split (TRANSPOSE)": (lambda x: tf.transpose(x, [0, 2, 1, 3]),
                                   [(1, s, heads, d)]),
        "residual ADD": (lambda a, b: a + b, [(1, s, h), (1, s, h)]),
    }
    table = {}
    for name, (function, shapes) in cases.items():
        table[name] = {}
        for mode in ("fp32", "int8"):
            ops = collections.Counter(op["op_name"] for op in
                                      _interpreter(_convert(function, shapes, mode))
                                      ._get_ops_details())
            table[name][mode] = ops["DELEGATE"]
    return table


def report(sequence_length, hidden, runs):
    lines = [
        "# TFLite int8 kernels on this CPU",
        "",
        f"`python benchmarks/tflite_int8_kernels.py --sequence-length {sequence_length} "
        f"--hidden {hidden}`; {platform.processor() or platform.machine()}, LiteRT with "
        "XNNPACK, 1 thread, best of "
        f"{runs} runs; TensorFlow {tf.__version__}.",
        "",
        "| dense layer | mode | ms | GOP/s |",
        "| --- | --- | ---: | ---: |",
    ]
    for shape, mode, ms, gops in gemm_throughput(sequence_length, hidden, runs):
        lines.append(f"| {shape} | {mode} | {ms:.3f} | {gops:.0f} |")
    lines += ["", "| op of a BERT block | XNNPACK takes it in fp32 | in full int8 |",
              "| --- | --- | --- |"]
    def taken(partitions):
        return {0: "no (builtin kernel)", 1: "yes"}.get(partitions,
                                                        f"partly ({partitions} partitions)")

    for name, modes in block_ops(sequence_length, hidden).items():
        lines.append(f"| {name} | {taken(modes['fp32'])} | {taken(modes['int8'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequence-length", type=int, default=48)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--output", help="also write the report to this file")
    args = parser.parse_args(argv)
    text = report(args.sequence_length, args.hidden, args.runs)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
