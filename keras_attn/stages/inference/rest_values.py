"""The JSON values of TensorFlow Serving's REST API (see `rest_api`): a request's values as
numpy arrays of a signature's dtypes (`to_array`), a model's numpy outputs as the row or
columnar answer (`rows_of`, `json_value`), the checks on both, and `RequestError`, the
`{"error": ...}` answer of a request the API refuses."""

import base64
import json
import re

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

MAX_JSON_DEPTH = 32  # nesting of lists/objects in a request (inputs are rank <= 2)
MAX_INTEGER_DIGITS = 20  # longer JSON integers are rejected before conversion
# A predict answer is at most this many times the request's bytes, plus the second constant
# per example: row answers by construction, columnar (padded) ones checked.
MAX_ANSWER_GROWTH, ANSWER_BYTES_PER_EXAMPLE = 16, 2048
# Outputs cut per row in row format: count output -> the outputs it counts.
COUNTED_OUTPUTS = {
    "num_words": ("words", "word_tags", "word_start", "word_end"),
    "num_entities": ("entity_type", "entity_text", "entity_start", "entity_end",
                     "entity_start_word", "entity_end_word"),
}



class RequestError(Exception):
    """A request the API answers with `status` and `{"error": message}`."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message



def dtype_name(dtype):
    """The `DataType` enum name TF Serving prints (`DT_FLOAT`, `DT_STRING`, `DT_INT32`)."""
    return types_pb2.DataType.Name(dtype.as_datatype_enum)



def to_array(value, spec, name, max_text_chars):
    """The request value of input `name` as a numpy array of `spec`'s dtype and rank; strings
    longer than `max_text_chars` characters are refused. Raises `RequestError` (400)."""
    is_string = spec.dtype == tf.string
    leaves, shape = [], []
    _flatten(value, leaves, shape, 0, name)
    if any(depth != len(shape) for _, depth in leaves):
        raise RequestError(400, f"Input {json.dumps(name)} is ragged: values and lists are "
                           "mixed at one depth; give a rectangular nested list")
    leaves = [leaf for leaf, _ in leaves]
    if spec.shape.rank is not None and len(shape) != spec.shape.rank:
        raise RequestError(400, f"Input {json.dumps(name)} must have rank "
                           f"{spec.shape.rank} (shape {_shape_text(spec.shape)}); the "
                           f"request gives shape {shape}")
    for dim, (given, wanted) in enumerate(zip(shape, spec.shape)):
        if wanted is not None and given != wanted:
            raise RequestError(400, f"Input {json.dumps(name)} must have {wanted} values "
                               f"in dimension {dim}; the request gives {given}")
    converted = []
    for index, leaf in enumerate(leaves):
        where = f"{json.dumps(name)} value {index}"
        if is_string:
            converted.append(_string(leaf, where, max_text_chars))
        elif spec.dtype.is_bool:
            if not isinstance(leaf, bool):
                raise RequestError(400, f"Input {where} must be true or false; received a "
                                   f"{json_type(leaf)}")
            converted.append(leaf)
        elif spec.dtype.is_integer:
            if isinstance(leaf, bool) or not isinstance(leaf, int):
                raise RequestError(400, f"Input {where} must be an integer "
                                   f"({dtype_name(spec.dtype)}); received "
                                   f"{json.dumps(leaf)[:40]}")
            if not spec.dtype.min <= leaf <= spec.dtype.max:
                raise RequestError(400, f"Input {where} = {leaf} does not fit "
                                   f"{dtype_name(spec.dtype)}")
            converted.append(leaf)
        else:
            if isinstance(leaf, bool) or not isinstance(leaf, (int, float)):
                raise RequestError(400, f"Input {where} must be a number "
                                   f"({dtype_name(spec.dtype)}); received a "
                                   f"{json_type(leaf)}")
            converted.append(leaf)
    array = np.array(converted, dtype=object if is_string else spec.dtype.as_numpy_dtype)
    return array.reshape(shape)

def _string(leaf, where, max_text_chars):
    if is_b64(leaf):
        try:
            data = base64.b64decode(leaf["b64"], validate=True)
        except (ValueError, TypeError):
            raise RequestError(400, f"Input {where}: `b64` is not valid base64") from None
        length = len(data)
    elif isinstance(leaf, str):
        data, length = leaf.encode("utf-8", "surrogatepass"), len(leaf)
    else:
        raise RequestError(400, f"Input {where} must be a string (the text); received a "
                           f"{json_type(leaf)}")
    if length > max_text_chars:
        raise RequestError(400, f"Input {where} has {length} characters; this server takes "
                           f"at most {max_text_chars} (--max-text-chars)")
    return data



def _flatten(value, leaves, shape, depth, name):
    """Appends `(leaf, depth)` of a nested list to `leaves` and the list lengths to `shape`;
    lists of different lengths at one depth are an error (ragged)."""
    if not isinstance(value, list):
        leaves.append((value, depth))
        return
    if depth >= MAX_JSON_DEPTH:
        raise RequestError(400, f"Input {json.dumps(name)} is nested deeper than "
                           f"{MAX_JSON_DEPTH} lists")
    if len(shape) == depth:
        shape.append(len(value))
    elif len(shape) < depth or shape[depth] != len(value):
        raise RequestError(400, f"Input {json.dumps(name)} is ragged: its lists have different "
                           f"lengths at depth {depth}; pad them to one length")
    for item in value:
        _flatten(item, leaves, shape, depth + 1, name)



def json_depth(text):
    """Deepest nesting of `[`/`{` in JSON text, strings skipped (checked before parsing:
    Python's parser recurses once per level)."""
    if "[" not in text and "{" not in text:
        return 0
    # Quoted strings out (escapes included), then the running depth of the brackets left.
    skeleton = re.sub(r'"(?:[^"\\]|\\.)*"', "", text)
    brackets = np.frombuffer(re.sub(r"[^\[\]{}]", "", skeleton).encode("ascii"), np.uint8)
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1)
    return int(np.cumsum(steps).max()) if steps.size else 0


def json_int(digits):
    if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise RequestError(400, f"The request has an integer of {len(digits)} digits; this "
                           f"server takes at most {MAX_INTEGER_DIGITS}")
    return int(digits)


def trim_columns(outputs):
    """Columnar NER outputs cut to the longest row of these rows (merged batches are padded to
    the longest row of the whole batch)."""
    outputs = dict(outputs)
    for count, names in COUNTED_OUTPUTS.items():
        if count in outputs and np.ndim(outputs[count]) == 1:
            width = int(np.max(outputs[count], initial=0))
            for name in names:
                if name in outputs and np.ndim(outputs[name]) >= 2:
                    outputs[name] = outputs[name][:, :width]
    return outputs


def check_padded_size(outputs, prepared):
    """Columnar NER answers are padded to the longest row: a 400 when the answer would pass
    `MAX_ANSWER_GROWTH` x the request + `ANSWER_BYTES_PER_EXAMPLE` per example."""
    limit = MAX_ANSWER_GROWTH * prepared.request_bytes + \
        ANSWER_BYTES_PER_EXAMPLE * (prepared.batch or 1)
    # Each padding value takes >= 4 bytes ('"", ', '-1, '): a lower bound, no JSON needed.
    padding = sum(np.size(outputs[name]) - int(np.sum(outputs[count]))
                  for count, names in COUNTED_OUTPUTS.items() if count in outputs
                  for name in names if name in outputs)
    size = 4 * padding if 4 * padding > limit else len(json.dumps(
        {"outputs": {k: json_value(v) for k, v in outputs.items()}},
        ensure_ascii=False).encode("utf-8"))
    if size > limit:
        words = int(np.max(outputs.get("num_words", [0]), initial=0))
        raise RequestError(400, f"The columnar answer would have >= {size} bytes: its rows are "
                           f"padded to the longest text ({words} words), and an answer is at "
                           f"most {MAX_ANSWER_GROWTH} x the request's {prepared.request_bytes} "
                           f"bytes + {ANSWER_BYTES_PER_EXAMPLE} per text. Send these texts in "
                           "row format (`instances`: each row lists only its own words), or "
                           "texts of similar lengths together")


def is_b64(value):
    return isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str)


def json_type(value):
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "list",
            dict: "object"}.get(type(value), type(value).__name__)


def _shape_text(shape):
    return "[" + ", ".join("-1" if d is None else str(d) for d in shape) + "]"


def json_value(array):
    """A numpy output as JSON values: UTF-8 text for strings (`{"b64": ...}` when not UTF-8),
    Python numbers, nested lists."""
    array = np.asarray(array)
    if array.dtype == object or array.dtype.kind == "S":
        def text(value):
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return {"b64": base64.b64encode(value).decode("ascii")}

        flat = [text(bytes(v)) for v in array.reshape(-1)]
        return np.array(flat, dtype=object).reshape(array.shape).tolist() if array.ndim \
            else flat[0]
    return array.tolist()


def rows_of(outputs, batch):
    """Row-format predictions: the outputs split along their first dimension, which must be
    the batch for every output (as TF Serving requires)."""
    for name, value in outputs.items():
        if np.ndim(value) == 0 or np.shape(value)[0] != batch:
            raise RequestError(400, f"Output {json.dumps(name)} has shape "
                               f"{list(np.shape(value))}, not a first dimension of {batch} "
                               "examples: call this signature in columnar format (`inputs`)")
    values = {name: json_value(value) for name, value in outputs.items()}
    if len(values) == 1:
        return next(iter(values.values()))
    rows = [{name: value[row] for name, value in values.items()} for row in range(batch)]
    for count, names in COUNTED_OUTPUTS.items():  # each row lists its own words / entities
        if count in values:
            for row in rows:
                for name in names:
                    if name in row and isinstance(row[name], list):
                        row[name] = row[name][:row[count]]
    return rows
