"""TFLite export of BERT task models: float, float16, dynamic-range int8, full int8 from
quantization-aware training (QAT) and full int8 by post-training quantization (PTQ).

Every artifact comes from a SavedModel of a `tf.function` with a static `(1, L)` int32
signature (`token_ids`, `segment_ids`, `padding_mask`) converted with
`tf.lite.TFLiteConverter.from_saved_model` and builtin ops only, so the graph holds no
dynamic-shape ops and no Flex/custom ops. The graph converted has the TFLite layout of the
encoder blocks' int8 layout (`EncoderInt8Layout`: 2-D matmuls, batched-matmul attention):
the `quantize_model` copy with its fake quantization for `int8`, the float model in that
layout (`float_layout_model`) for the float variants and `int8_ptq`. The output is
float32 `logits` in every variant (the full-int8 models end with one DEQUANTIZE: apps get
logits, not int8 codes and scales).

**Length buckets.** With `buckets=(16, 24, 32, 48, ..., L)` the file
(`{prefix}{variant}_buckets.tflite`) holds one signature per length: `serving_default` at
the longest length `L` (so tools that read the default signature or the first subgraph, like
MediaPipe, see the fixed-length model) and `tokens_{n}` for each shorter one. The converter
stores a weight once when several signatures use the same constant, and the worker stores
the weights' quantization parameters once too (`keras_attn.export.tflite.tflite_sharing`), so the
file is only 1-2 % larger than the fixed one (MiniLM-L6, 5 and 7 signatures);
`keras_attn.export.tflite.tflite_runtime.BucketedTFLite` runs each input on the shortest signature
that holds its tokens.

The converter leaks memory across conversions, so conversion runs in a child process
(`keras_attn.export.tflite._convert_worker`, all requested variants in one job, in the child
that `keras_attn.export.tflite.converter_process` keeps for the next conversion).
"""

import json
import logging
import os
import tempfile
import time
from collections import Counter

import numpy as np
from tensorflow.lite.python import schema_py_generated as schema

from keras_attn.errors import KerasAttnError
from keras_attn.export.tflite.converter_process import run_job
from keras_attn.layers.validation import check_int
from keras_attn.quantization.dequantize_model import dequantize_model
from keras_attn.quantization.emissions_model import emissions_model
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.model_queries import uncalibrated_quantizers
from keras_attn.quantization.quantized_model import QuantizedModel
from keras_attn.runs.task_head import ID_INPUTS
from keras_attn.runs.task_head import check_length
from keras_attn.runs.task_head import max_sequence_length

logger = logging.getLogger(__name__)

TFLITE_VARIANTS = ("fp32", "fp16", "dynamic_int8", "int8", "int8_ptq")
# Score of padded attention keys in the float graph that the converter calibrates for
# `int8_ptq`: bounded (an additive -1e9 would set the int8 scale of the scores).
PTQ_MASKED_SCORE = -20.0
_INTEGER_TYPES = ("INT8", "INT32", "BOOL", "INT64", "INT16")
DEFAULT_SIGNATURE = "serving_default"
# Shorter buckets' signatures: "tokens_16"... They sort after "serving_default", and the
# converter orders subgraphs by signature name, so the default stays subgraph 0.
BUCKET_SIGNATURE_PREFIX = "tokens_"
BUCKETS_FILE_SUFFIX = "_buckets"
SMALLEST_BUCKET = 16


class TFLiteExportError(KerasAttnError, RuntimeError):
    """A conversion failed or produced an artifact that breaks its contract."""


def bucket_lengths(sequence_length, smallest=SMALLEST_BUCKET):
    """The lengths of a bucketed model: `smallest` times the powers of two and their
    midpoints (x1.5) below `sequence_length`, then `sequence_length` itself.

    Two steps per doubling pad an input by at most a third of its bucket instead of a half.
    Measured on SST-2 dev (MiniLM-L6 fp32, length 64, median 24 tokens; docs/export.md):
    p50 0.62x the fixed file with 16 / 32 / 64, 0.58x with 16 / 24 / 32 / 48 / 64. Each
    more signature adds its op tables (~55 KB in MiniLM's float and dynamic int8 files,
    ~90 KB in int8) and, in float files, its slice of the position table.

    Example:
    >>> bucket_lengths(128), bucket_lengths(48), bucket_lengths(16)
    ((16, 24, 32, 48, 64, 96, 128), (16, 24, 32, 48), (16,))
    """
    lengths, length = [], smallest
    while length < sequence_length:
        for n in (length, length * 3 // 2):
            if n < sequence_length and n not in lengths:
                lengths.append(n)
        length *= 2
    return tuple(lengths) + (sequence_length,)


def bucket_signature(length, sequence_length):
    """The signature key of the bucket of `length` in a model of `sequence_length`.

    Example:
    >>> bucket_signature(32, 128), bucket_signature(128, 128)
    ('tokens_32', 'serving_default')
    """
    return DEFAULT_SIGNATURE if length == sequence_length else \
        f"{BUCKET_SIGNATURE_PREFIX}{length}"


def export_tflite(model, output_dir, variants=TFLITE_VARIANTS, sequence_length=128,
                  representative_data=None, file_prefix="model_", buckets=None):
    """Converts a BERT task model to TFLite artifacts, in the converter's child process.

    Args:
        model: a `QuantizedModel` or `quantize_model` copy (needed for `int8`; its ranges
            trained or calibrated; the float variants convert its `dequantize_model`), or a
            float `BertClassifier` / `BertTokenClassifier` (float variants and `int8_ptq`).
        output_dir: directory the `.tflite` files are written to
            (`{file_prefix}{variant}.tflite`).
        variants: names from `TFLITE_VARIANTS`.
        sequence_length: int, the fixed sequence length `L` of the signature.
        representative_data: iterable of input dicts of `(B, L)` int arrays, real inputs.
            Required by `int8_ptq` (the ranges) and by `int8`, where the converter
            calibrates with it only the few tensors without a fake quant (the products
            `centered * inverse_std * gamma` inside each LayerNorm).
        file_prefix: str, file name prefix.
        buckets: `None` (one signature of length `L`), or increasing lengths ending with
            `L` (e.g. `bucket_lengths(L)`): one signature each, in files named
            `{file_prefix}{variant}_buckets.tflite`.

    Returns:
        Dict variant -> `{"path", "size_bytes", "ops", "non_int8_ops"}` (see
        `tflite_op_report`).

    Raises:
        ValueError: bad arguments (named). TFLiteExportError: the conversion failed, or a
        Flex/custom op appeared.
    """
    variants = _check_variants(variants)
    _check_buckets(buckets, sequence_length)
    graphs = _graph_models(model, variants)
    limit = max_sequence_length(next(iter(graphs.values())))
    if limit is not None:
        _check_sequence_length(sequence_length, limit)
    examples = None
    needs_data = [v for v in variants if v in ("int8", "int8_ptq")]
    if needs_data:
        examples = _single_examples(representative_data, sequence_length, needs_data)
    suffix = BUCKETS_FILE_SUFFIX if buckets is not None else ""
    outputs = {v: os.path.join(os.path.abspath(output_dir), f"{file_prefix}{v}{suffix}.tflite")
               for v in variants}
    os.makedirs(output_dir, exist_ok=True)
    _convert_in_child(graphs, examples, outputs, tuple(buckets or (sequence_length,)))
    results = {}
    for variant, path in outputs.items():
        report = tflite_op_report(path)
        check_builtins_only(report, path)
        results[variant] = {"path": path, "size_bytes": os.path.getsize(path), **report}
    return results


def _check_variants(variants):
    variants = tuple(variants)
    unknown = [v for v in variants if v not in TFLITE_VARIANTS]
    if unknown or not variants:
        raise ValueError(
            f"`variants` must be a non-empty subset of {TFLITE_VARIANTS}. "
            f"Received: variants={variants!r}"
        )
    return variants


def _graph_models(model, variants):
    """`{"int8": quantized graph, "float": float graph}`, each only when a variant asked
    needs it: the files hold a CRF tagger's emissions (`emissions_model`), the float model
    of a quantized one is its `dequantize_model` (the fine-tuned weights)."""
    model = model.model if isinstance(model, QuantizedModel) else model
    quantized = bool(activation_quantizers(model))
    graphs = {}
    if "int8" in variants:
        if not quantized:
            raise ValueError(
                "The `int8` variant is converted from a quantization-aware model: pass "
                "`QuantizedModel.calibrated(model, batches)` (or a calibrated or QAT-trained "
                "`quantize_model(model)`), or ask for `int8_ptq`. Received: a float "
                + type(model).__name__)
        missing = uncalibrated_quantizers(model)
        if missing:
            raise ValueError(
                "The `int8` variant needs trained or calibrated activation ranges; "
                f"{len(missing)} quantizers have none (first: {missing[0]}). Train the "
                "model or call `calibrate_model(model, batches)` first.")
        graphs["int8"] = emissions_model(model)
    if any(v != "int8" for v in variants):
        graphs["float"] = emissions_model(dequantize_model(model) if quantized else model)
    return graphs


def _check_sequence_length(sequence_length, limit):
    check_int("sequence_length", sequence_length, 1)
    check_length(sequence_length, limit, "sequence_length",
                 fix=f"export with a sequence_length of at most {limit}")


def _check_buckets(buckets, sequence_length):
    if buckets is None:
        return
    lengths = list(buckets)
    if (not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                           for n in lengths)
            or lengths != sorted(set(lengths)) or lengths[-1] != sequence_length):
        raise ValueError(
            "`buckets` must be increasing positive ints ending with the sequence length "
            f"{sequence_length} (e.g. bucket_lengths({sequence_length}) = "
            f"{bucket_lengths(sequence_length)}). Received: buckets={buckets!r}"
        )


def _convert_in_child(graphs, examples, outputs, lengths):
    """Saves the `graphs` (and the examples) and runs `_convert_worker.main` on them."""
    with tempfile.TemporaryDirectory(prefix="keras_attn_tflite_") as work:
        model_paths = {}
        for kind, graph in graphs.items():
            model_paths[kind] = os.path.join(work, f"{kind}.keras")
            graph.save(model_paths[kind])
        data_path = None
        if examples is not None:
            data_path = os.path.join(work, "representative.npz")
            np.savez(data_path, **examples)
        job = {"model_paths": model_paths, "data_path": data_path, "work_dir": work,
               "lengths": list(lengths), "variants": list(outputs), "outputs": outputs,
               "ptq_masked_score": PTQ_MASKED_SCORE}
        job_path = os.path.join(work, "job.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        started = time.perf_counter()
        result = run_job("keras_attn.export.tflite._convert_worker:main", [job_path])
        if not result.ok:
            raise TFLiteExportError(
                f"TFLite conversion of {list(outputs)} failed {result.failure()}")
        logger.info("Converted %s (lengths %s) in %.1f s", list(outputs), list(lengths),
                    time.perf_counter() - started)


def _single_examples(representative_data, sequence_length, variants):
    """The representative inputs as `(N, 1, L)` int32 arrays per input name."""
    if representative_data is None:
        raise ValueError(
            f"{variants} need `representative_data`: a list of input dicts of real "
            f"`(B, {sequence_length})` token ids, segment ids and padding masks "
            "(the converter calibrates int8 ranges on them). Received: "
            "representative_data=None"
        )
    rows = {name: [] for name in ID_INPUTS}
    for index, batch in enumerate(representative_data):
        if not isinstance(batch, dict) or any(name not in batch for name in ID_INPUTS):
            raise ValueError(
                f"`representative_data[{index}]` must be a dict with keys {ID_INPUTS}. "
                f"Received: {type(batch).__name__}"
            )
        for name in ID_INPUTS:
            array = np.asarray(batch[name]).astype("int32")
            if array.ndim == 1:
                array = array[None]
            if array.ndim != 2 or array.shape[1] != sequence_length:
                raise ValueError(
                    f"`representative_data[{index}]['{name}']` must have shape "
                    f"(B, {sequence_length}) (the export sequence length). "
                    f"Received: shape={array.shape}"
                )
            rows[name].extend(array[:, None, :])
    if not rows["token_ids"]:
        raise ValueError("`representative_data` is empty. Received: representative_data=[]")
    return {name: np.stack(values) for name, values in rows.items()}


def tflite_op_report(model):
    """Operator histogram of a `.tflite` flatbuffer (path or bytes), read from the
    flatbuffer itself (no interpreter, so it works for models with custom ops).

    Returns:
        Dict: `ops` {op name -> count} (custom ops under their custom code, e.g.
        `FlexEinsum`), `custom_ops` (sorted names of custom/Flex ops), `non_int8_ops`
        {op name -> count} of the ops with a float input or output (for a full-int8
        model: every op that does not run in integer arithmetic), `input_types` and
        `output_types` of the signature tensors, `input_shapes`.
    """
    if isinstance(model, (str, os.PathLike)):
        with open(model, "rb") as f:
            model = f.read()
    flat = schema.Model.GetRootAsModel(bytearray(model), 0)
    builtin_names = {v: k for k, v in vars(schema.BuiltinOperator).items()
                     if not k.startswith("_")}
    type_names = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    codes = []
    for i in range(flat.OperatorCodesLength()):
        code = flat.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        name = builtin_names.get(builtin, str(builtin))
        is_custom = name == "CUSTOM"
        if is_custom:
            name = code.CustomCode().decode()
        codes.append((name, is_custom))
    ops, non_int8, custom = Counter(), Counter(), set()
    graph = flat.Subgraphs(0)

    def tensor_type(index):
        return type_names[graph.Tensors(index).Type()]

    for j in range(graph.OperatorsLength()):
        op = graph.Operators(j)
        name, is_custom = codes[op.OpcodeIndex()]
        ops[name] += 1
        if is_custom:
            custom.add(name)
        tensors = [t for t in list(op.InputsAsNumpy()) + list(op.OutputsAsNumpy()) if t >= 0]
        if any(tensor_type(t) not in _INTEGER_TYPES for t in tensors):
            non_int8[name] += 1
    inputs = [graph.Inputs(i) for i in range(graph.InputsLength())]
    outputs = [graph.Outputs(i) for i in range(graph.OutputsLength())]
    return {
        "ops": dict(sorted(ops.items())),
        "custom_ops": sorted(custom),
        "non_int8_ops": dict(sorted(non_int8.items())),
        "input_types": [tensor_type(t) for t in inputs],
        "input_shapes": [graph.Tensors(t).ShapeAsNumpy().tolist() for t in inputs],
        "output_types": [tensor_type(t) for t in outputs],
    }


def check_builtins_only(report, path):
    """Raises `TFLiteExportError` if a Flex or custom op is in a builtins-only artifact."""
    if report["custom_ops"]:
        raise TFLiteExportError(
            f"{path} contains Flex/custom ops {report['custom_ops']}, which stock LiteRT on "
            "Android cannot run. Mobile artifacts must use builtin ops only: express the "
            "offending op with builtin-convertible ops (ops histogram: "
            f"{report['ops']})."
        )
