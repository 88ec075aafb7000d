"""Running keras-attn TFLite files: the default signature, `BucketedTFLite` (each input on the
shortest length bucket that holds it), `run_tflite` and `benchmark_tflite`."""

import time

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from keras_attn.export.tflite.tflite_export import DEFAULT_SIGNATURE
from keras_attn.runs.task_head import ID_INPUTS


def _interpreter(path, num_threads):
    interpreter = Interpreter(model_path=str(path), num_threads=num_threads)
    interpreter.allocate_tensors()
    return interpreter


def default_signature_key(interpreter):
    """`serving_default` (the full-length signature of a bucketed file), or the only
    signature's key."""
    keys = list(interpreter.get_signature_list())
    if DEFAULT_SIGNATURE not in keys and len(keys) != 1:
        raise ValueError(f"the model has signatures {keys}: none is {DEFAULT_SIGNATURE!r} "
                         "and there is not exactly one; keras-attn TFLite files have "
                         f"{DEFAULT_SIGNATURE!r}")
    return DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in keys else keys[0]


def default_signature_runner(interpreter):
    """The runner of `default_signature_key(interpreter)`."""
    return interpreter.get_signature_runner(default_signature_key(interpreter))


def _input_index(interpreter):
    """Default signature's input name -> tensor index."""
    details = default_signature_runner(interpreter).get_input_details()
    return {name: details[name]["index"] for name in ID_INPUTS}


class BucketedTFLite:
    """Runs a batch-1 token-id TFLite model on the shortest of its signatures that holds an
    input's real tokens (a fixed-length file has one signature: it always runs that one).

    The input is cut to the bucket's length `n`: positions `n..L-1` are padding, which the
    attention mask hides, so the outputs of the real tokens are those of the `L` signature
    up to float rounding.

    Args:
        interpreter: a LiteRT `Interpreter` (or `InterpreterWithCustomOps`) of the model.

    Call arguments:
        inputs: dict of `(1, L)` int arrays of the default signature's length `L`, the real
            tokens first (`padding_mask` is 1 on them, 0 after).

    Returns:
        float32 logits, `(1, C)`, or `(1, L, C)` for a tagger (zeros after the bucket).

    Example (with a file written by `export_tflite(..., buckets=bucket_lengths(128))`):

        model = BucketedTFLite(Interpreter(model_path="model_int8_buckets.tflite"))
        model.lengths        # (16, 24, 32, 48, 64, 96, 128)
        logits = model(x)    # x: (1, 128) inputs of 20 real tokens -> runs `tokens_24`
    """

    def __init__(self, interpreter):
        self.runners, default = {}, None
        for key in interpreter.get_signature_list():
            runner = interpreter.get_signature_runner(key)
            details = runner.get_input_details()
            if "token_ids" not in details:
                raise ValueError(f"signature {key!r} has inputs {sorted(details)}, not the "
                                 f"token-id inputs {list(ID_INPUTS)}")
            length = int(details["token_ids"]["shape"][1])
            self.runners[length] = (runner, tuple(details))
            if key == DEFAULT_SIGNATURE:
                default = length
        self.lengths = tuple(sorted(self.runners))
        self.sequence_length = default or self.lengths[-1]

    def bucket(self, num_tokens):
        """The shortest length that holds `num_tokens` tokens."""
        for length in self.lengths:
            if length >= num_tokens:
                return length
        raise ValueError(f"{num_tokens} tokens do not fit the model's longest signature "
                         f"({self.lengths[-1]}): truncate to {self.lengths[-1]} tokens")

    def __call__(self, inputs):
        mask = np.asarray(inputs["padding_mask"])
        real = np.flatnonzero(mask[0])
        length = self.bucket(int(real[-1]) + 1 if real.size else 1)
        runner, names = self.runners[length]
        (logits,) = runner(**{name: np.asarray(inputs[name])[:, :length].astype("int32")
                              for name in names}).values()
        logits = np.asarray(logits, "float32")
        if logits.ndim == 3 and length < self.sequence_length:  # (1, n, C) -> (1, L, C)
            logits = np.pad(logits, ((0, 0), (0, self.sequence_length - length), (0, 0)))
        return logits


def run_tflite(path, inputs, num_threads=1):
    """Logits of a `.tflite` artifact for a batch, one example at a time (batch-1 model), each
    on the shortest signature that holds its tokens (`BucketedTFLite`).

    Args:
        path: the `.tflite` file.
        inputs: dict of `(B, L)` int arrays.

    Returns:
        float32 array `(B, ...)` of logits.
    """
    model = BucketedTFLite(_interpreter(path, num_threads))
    batch = np.asarray(inputs["token_ids"]).shape[0]
    return np.stack([model({name: np.asarray(inputs[name])[b:b + 1] for name in ID_INPUTS})[0]
                     for b in range(batch)])


def benchmark_tflite(path, num_threads=1, runs=50, warmup=5, sequence_length=None,
                     seed=0):
    """p50/p90 latency (ms) of one batch-1 inference with LiteRT (XNNPACK, default
    delegate) on random token ids with a full padding mask.

    Returns:
        Dict `{"p50_ms", "p90_ms", "runs", "num_threads"}`.
    """
    interpreter = _interpreter(path, num_threads)
    indices = _input_index(interpreter)
    details = {d["index"]: d for d in interpreter.get_input_details()}
    length = sequence_length or int(details[indices["token_ids"]]["shape"][1])
    rng = np.random.default_rng(seed)
    values = {
        "token_ids": rng.integers(1000, 2000, (1, length)).astype("int32"),
        "segment_ids": np.zeros((1, length), "int32"),
        "padding_mask": np.ones((1, length), "int32"),
    }
    for name, index in indices.items():
        interpreter.set_tensor(index, values[name])
    for _ in range(warmup):
        interpreter.invoke()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        interpreter.invoke()
        times.append((time.perf_counter() - start) * 1000.0)
    return {"p50_ms": float(np.percentile(times, 50)), "p90_ms": float(np.percentile(times, 90)),
            "runs": runs, "num_threads": num_threads}
