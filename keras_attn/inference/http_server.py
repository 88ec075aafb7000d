"""`keras-attn serve`: the SavedModel over HTTP with TensorFlow Serving's REST API.

Clients written for TF Serving (`tensorflow_model_server --rest_api_port`) work unchanged:

- `GET /v1/models/NAME[/versions/V]`: model status,
  `{"model_version_status": [{"version": "1", "state": "AVAILABLE", "status":
  {"error_code": "OK", "error_message": ""}}]}`;
- `GET /v1/models/NAME[/versions/V]/metadata`: `{"model_spec": {...}, "metadata":
  {"signature_def": {"signature_def": {name: {"inputs", "outputs", "method_name"}}}}}`, the
  JSON form of the SavedModel's `SignatureDef`s (dtypes `DT_STRING`..., `tensor_shape.dim`
  sizes as strings, `-1` for a dynamic dimension);
- `POST /v1/models/NAME[/versions/V]:predict` with `{"signature_name": ..., "instances":
  [...]}` (row format) or `{"inputs": ...}` (columnar format). Row format: `instances` is a
  list with one entry per example, the input's value (`"some text"`), or an object of input
  name -> value (`{"text": "some text"}`; required for a signature with several inputs).
  Columnar: `inputs` is the single input's batch, or an object of input name -> batch. The
  response is `{"predictions": [...]}` (row; a list of output-name -> value objects when the
  signature has several outputs, as our `serving_default` has) or `{"outputs": ...}`
  (columnar; an object of output name -> batch). Values are returned exactly as the
  signature computes them, as TF Serving does: the NER outputs keep their per-batch padding
  (`""` / `-1` up to the longest row of the request; `num_entities`, `num_words` say how many
  are real). Strings are UTF-8 text; binary string inputs may be sent as `{"b64": ...}`.

Errors are `{"error": "<message>"}`: 400 for invalid JSON, a missing, empty or wrongly typed
`instances` / `inputs`, an unknown signature or input name, a text longer than
`max_text_chars`, a batch larger than `max_batch`, a malformed HTTP request and any
Content-Length but exactly one of digits; 404 for an unknown model, version or route; 405 for
a wrong HTTP method; 408 for a request not received within its deadline; 411 without
`Content-Length`; 413 for a body larger than `max_request_bytes` (not read); 500 when the
model itself fails; 503 when the server is at its connection or queue limit; 504 when the
answer is not ready within the request deadline. No request can stop the server: every handler
error becomes a response.

Row-format NER answers list each text's own words and entities (`words`, `word_tags`, ...
cut to that row's `num_words`, `entity_*` to its `num_entities`); columnar answers are padded
to the longest row of the request, as the signature pads them. Either is at most
`MAX_ANSWER_GROWTH` (16) times the request's bytes plus `ANSWER_BYTES_PER_EXAMPLE` (2,048)
per example: row answers by construction, columnar ones past it get 400 (use the row
format). `predict_ids` inputs are checked before any model work: at most the model's
`sequence_length` tokens, token ids in `[0, vocabulary size)`, `padding_mask` 0 or 1,
`segment_ids` >= 0.

The transport is uvicorn (`make_server`): an asyncio HTTP/1.1 server with a bounded number of
connections, header and request deadlines, a listen backlog and size limits; the model runs
in a bounded pool of worker threads fed by a `RequestBatcher` that merges concurrent
requests into model batches.

The version is `1`, or the number of the version directory when the path is laid out for TF
Serving (`NAME/1/saved_model.pb`).
"""

import asyncio
import base64
import collections
import concurrent.futures
import dataclasses
import json
import pathlib
import re
import socket
import threading
import time

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from keras_attn.export.serving_module import load_saved_model
from keras_attn.inference.request_batcher import QueueFullError
from keras_attn.inference.request_batcher import RequestBatcher
from keras_attn.layers.validation import check_number
from keras_attn.layers.validation import check_positive_int

DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_REQUEST_BYTES = 1_000_000
DEFAULT_MAX_TEXT_CHARS = 20_000
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
_ROUTE = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?"
    r"(?P<verb>/metadata|:[A-Za-z]+)?/?$"
)


class RequestError(Exception):
    """A request the API answers with `status` and `{"error": message}`."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def find_saved_model(path):
    """`(saved_model_dir, version)` for a SavedModel directory, an export directory holding
    `saved_model/`, or a TF Serving base path with numbered version directories (the highest
    version is served)."""
    path = pathlib.Path(path)
    if (path / "saved_model.pb").is_file():
        version = path.name if path.name.isdigit() else "1"
        return path, version
    if (path / "saved_model" / "saved_model.pb").is_file():
        return path / "saved_model", "1"
    versions = sorted((int(p.name), p) for p in path.glob("*")
                      if p.name.isdigit() and (p / "saved_model.pb").is_file()) \
        if path.is_dir() else []
    if versions:
        return versions[-1][1], str(versions[-1][0])
    raise ValueError(
        f"{path} holds no SavedModel: give the saved_model/ directory of `keras-attn export`, "
        "the export directory itself, or a TF Serving base path with version directories "
        "(NAME/1/saved_model.pb)")


def _dtype_name(dtype):
    """The `DataType` enum name TF Serving prints (`DT_FLOAT`, `DT_STRING`, `DT_INT32`)."""
    return types_pb2.DataType.Name(dtype.as_datatype_enum)


def _tensor_info(spec):
    shape = spec.shape
    return {
        "dtype": _dtype_name(spec.dtype),
        "tensor_shape": {"dim": [] if shape.rank is None else
                         [{"size": str(-1 if d is None else d), "name": ""} for d in shape],
                         "unknown_rank": shape.rank is None},
        "name": f"{spec.name}:0",
    }


class RestApi:
    """TF Serving's REST API over one SavedModel, without the HTTP transport (see the module
    docstring). Thread-safe: the signatures are TensorFlow concrete functions.

    Args:
        saved_model_dir: a SavedModel directory (or see `find_saved_model`).
        model_name: str, the `NAME` of the URLs.
        max_batch: int, most examples per predict request.
        max_text_chars: int, longest string value (characters) of a request.

    Example:
    >>> api = RestApi.__new__(RestApi)  # no model needed to route a request
    >>> api.model_name, api.version = "sst2", "1"
    >>> api.handle("GET", "/v1/models/other", b"")
    (404, {'error': 'Servable not found for request: Latest(other)'})
    """

    def __init__(self, saved_model_dir, model_name="model", max_batch=DEFAULT_MAX_BATCH,
                 max_text_chars=DEFAULT_MAX_TEXT_CHARS):
        check_positive_int("max_batch", max_batch)
        check_positive_int("max_text_chars", max_text_chars)
        if not isinstance(model_name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", model_name):
            raise ValueError("`model_name` must be letters, digits, '_', '.' or '-' (it is part "
                             f"of the URL). Received: model_name={model_name!r}")

        directory, self.version = find_saved_model(saved_model_dir)
        self.saved_model_dir = directory
        self.model_name = model_name
        self.max_batch = max_batch
        self.max_text_chars = max_text_chars
        self.saved_model = load_saved_model(directory)
        self.signatures = dict(self.saved_model.signatures)
        self.input_specs = {}
        for name, function in self.signatures.items():
            specs = function.structured_input_signature[1]  # keyword inputs: name -> TensorSpec
            self.input_specs[name] = dict(sorted(specs.items()))
        self.sequence_length, self.vocabulary_size = _id_limits(self.signatures, directory)

    # --- routing ----------------------------------------------------------------------------

    def handle(self, method, path, body):
        """`(status, response dict)` of one request, the model called in this thread. Never
        raises."""
        try:
            verb = self.route(method, path)
            if verb is None:
                return 200, self.status()
            if verb == "/metadata":
                return 200, self.metadata()
            return 200, self.predict(body)
        except RequestError as error:
            return error.status, {"error": error.message}

    def route(self, method, path):
        """The verb of a valid request (`None` status, `"/metadata"`, `":predict"`); raises
        `RequestError` (404, 405) otherwise."""
        path = path.split("?", 1)[0]
        match = _ROUTE.match(path)
        if match is None:
            raise RequestError(404, f"Malformed request: {method} {path}. Routes: GET "
                               "/v1/models/NAME, GET /v1/models/NAME/metadata, POST "
                               "/v1/models/NAME:predict (optionally with /versions/N)")
        name, version, verb = match.group("name", "version", "verb")
        if name != self.model_name or version not in (None, self.version):
            request = f"Latest({name})" if version is None else f"Specific({name}, {version})"
            raise RequestError(404, f"Servable not found for request: {request}")
        wanted = {None: "GET", "/metadata": "GET", ":predict": "POST"}.get(verb)
        if wanted is None:
            raise RequestError(404, f"Malformed request: {method} {path}: this server "
                               "implements :predict only (the SavedModel has no "
                               "classify/regress signatures)")
        if method != wanted:
            raise RequestError(405, f"{method} is not allowed on {path}: use {wanted}")
        return verb

    def status(self):
        return {"model_version_status": [{
            "version": self.version, "state": "AVAILABLE",
            "status": {"error_code": "OK", "error_message": ""}}]}

    def metadata(self):
        signature_def = {}
        for name, function in self.signatures.items():
            outputs = function.structured_outputs
            signature_def[name] = {
                "inputs": {k: _tensor_info(s) for k, s in self.input_specs[name].items()},
                "outputs": {k: _tensor_info(outputs[k]) for k in sorted(outputs)},
                "method_name": "tensorflow/serving/predict",
            }
        return {"model_spec": {"name": self.model_name, "signature_name": "",
                               "version": self.version},
                "metadata": {"signature_def": {"signature_def": signature_def}}}

    # --- predict ----------------------------------------------------------------------------

    def predict(self, body):
        """The response dict of a predict request body; raises `RequestError`."""
        prepared = self.prepare(body)
        return self.answer(prepared, self.run(prepared.signature, prepared.inputs))

    def prepare(self, body):
        """A checked predict request: `Prepared(signature, inputs, columnar, batch,
        request_bytes)` with `inputs` numpy arrays of the signature's dtypes; raises
        `RequestError` (400)."""
        request = self._parse(body)
        unknown = sorted(set(request) - {"signature_name", "instances", "inputs"})
        if unknown:
            raise RequestError(400, f"Unknown key(s) {unknown} in the request: a predict "
                               "request has `instances` or `inputs`, and `signature_name`")
        signature = request.get("signature_name", "serving_default")
        if not isinstance(signature, str) or signature not in self.signatures:
            raise RequestError(400, f"Serving signature name: {json.dumps(signature)} not "
                               f"found in signature def (signatures: {sorted(self.signatures)})")
        specs = self.input_specs[signature]
        if ("instances" in request) == ("inputs" in request):
            raise RequestError(400, "The request must have either `instances` (row format) or "
                               "`inputs` (columnar format), not both and not neither")
        if "instances" in request:
            columns, batch = self._rows(request["instances"], specs)
        else:
            columns, batch = self._columns(request["inputs"], specs)
        inputs = {name: self._array(columns[name], spec, name) for name, spec in specs.items()}
        if signature == "predict_ids" or "token_ids" in inputs:
            self._check_ids(inputs)
        return Prepared(signature, inputs, "inputs" in request, batch, len(body))

    def batch_key(self, prepared):
        """`(key, mergeable)`: requests with equal keys can be merged into one model batch
        when `mergeable` (every input has a batch dimension). `key[0]` is the signature."""
        mergeable = bool(prepared.inputs) and all(a.ndim for a in prepared.inputs.values())
        shapes = tuple((name, a.shape[1:]) for name, a in sorted(prepared.inputs.items()))
        return (prepared.signature,) + shapes, mergeable

    def answer(self, prepared, outputs):
        """The response dict of `prepared` given the model's outputs for its rows."""
        if prepared.columnar:
            outputs = _trim_columns(outputs)
            if any(count in outputs for count in COUNTED_OUTPUTS):
                _check_padded_size(outputs, prepared)
            values = {k: _json_value(v) for k, v in outputs.items()}
            return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
        return {"predictions": _rows_of(outputs, prepared.batch)}

    def _check_ids(self, inputs):
        """`predict_ids` inputs within the model's sequence length and vocabulary."""
        for name, array in inputs.items():
            if array.ndim != 2:
                continue
            if self.sequence_length and array.shape[1] > self.sequence_length:
                raise RequestError(400, f"Input {json.dumps(name)} has {array.shape[1]} tokens "
                                   f"per example; this model takes at most "
                                   f"{self.sequence_length} (its sequence_length)")
            high = {"token_ids": self.vocabulary_size, "padding_mask": 2,
                    "label_mask": 2}.get(name)
            bad = (array < 0) if high is None else ((array < 0) | (array >= high))
            if bad.any():
                row, column = (int(i) for i in np.argwhere(bad)[0])
                allowed = f"[0, {high})" if high else ">= 0"
                raise RequestError(400, f"Input {json.dumps(name)} value {array[row, column]} at "
                                   f"[{row}, {column}] is out of range: allowed {allowed}")

    def _parse(self, body):
        if not body:
            raise RequestError(400, "Empty request body: send a JSON object such as "
                               '{"instances": ["some text"]}')
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RequestError(400, f"The request body is not UTF-8 (byte {error.start})") \
                from None
        depth = _json_depth(text)
        if depth > MAX_JSON_DEPTH:
            raise RequestError(400, f"The request nests lists/objects {depth} levels deep; "
                               f"this server takes at most {MAX_JSON_DEPTH}")
        try:
            request = json.loads(text, parse_int=_json_int)
        except json.JSONDecodeError as error:
            raise RequestError(400, f"Invalid JSON at line {error.lineno} column "
                               f"{error.colno}: {error.msg}") from None
        if not isinstance(request, dict):
            raise RequestError(400, "The request must be a JSON object such as "
                               f'{{"instances": [...]}}; received a {_json_type(request)}')
        return request

    def _rows(self, instances, specs):
        if not isinstance(instances, list):
            raise RequestError(400, f"`instances` must be a list (one entry per example); "
                               f"received a {_json_type(instances)}")
        if not instances:
            raise RequestError(400, "`instances` is empty: send at least one example")
        if not specs:
            raise RequestError(400, "This signature takes no inputs: call it in columnar "
                               'format, {"signature_name": ..., "inputs": {}}')
        self._check_batch(len(instances))
        names = list(specs)
        columns = {name: [] for name in names}
        for index, instance in enumerate(instances):
            if isinstance(instance, dict) and not _is_b64(instance):
                self._check_names(instance, names, f"instances[{index}]")
                for name in names:
                    columns[name].append(instance[name])
            elif len(names) == 1:
                columns[names[0]].append(instance)
            else:
                raise RequestError(400, f"instances[{index}] must be an object with the inputs "
                                   f"{names}; received a {_json_type(instance)}")
        return columns, len(instances)

    def _columns(self, inputs, specs):
        names = list(specs)
        if isinstance(inputs, dict) and not _is_b64(inputs):
            self._check_names(inputs, names, "inputs")
            columns = dict(inputs)
        elif len(names) == 1:
            columns = {names[0]: inputs}
        else:
            raise RequestError(400, f"`inputs` must be an object with the inputs {names}; "
                               f"received a {_json_type(inputs)}")
        batch = None
        for name in names:
            if specs[name].shape.rank:
                if not isinstance(columns[name], list):
                    raise RequestError(400, f"inputs[{json.dumps(name)}] must be a list (a "
                                       f"batch); received a {_json_type(columns[name])}")
                if not columns[name]:
                    raise RequestError(400, f"inputs[{json.dumps(name)}] is empty: send at "
                                       "least one example")
                batch = len(columns[name])
                self._check_batch(batch)
        return columns, batch

    def _check_names(self, given, names, where):
        missing = [n for n in names if n not in given]
        unknown = sorted(set(given) - set(names))
        if missing or unknown:
            raise RequestError(400, f"{where} has inputs {sorted(given)}; the signature takes "
                               f"{names} (missing {missing}, unknown {unknown})")

    def _check_batch(self, size):
        if size > self.max_batch:
            raise RequestError(400, f"The request has {size} examples; this server takes at "
                               f"most {self.max_batch} per request (--max-batch): split it")

    def _array(self, value, spec, name):
        """The request value of input `name` as a numpy array of `spec`'s dtype and rank."""
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
                converted.append(self._string(leaf, where))
            elif spec.dtype.is_bool:
                if not isinstance(leaf, bool):
                    raise RequestError(400, f"Input {where} must be true or false; received a "
                                       f"{_json_type(leaf)}")
                converted.append(leaf)
            elif spec.dtype.is_integer:
                if isinstance(leaf, bool) or not isinstance(leaf, int):
                    raise RequestError(400, f"Input {where} must be an integer "
                                       f"({_dtype_name(spec.dtype)}); received "
                                       f"{json.dumps(leaf)[:40]}")
                if not spec.dtype.min <= leaf <= spec.dtype.max:
                    raise RequestError(400, f"Input {where} = {leaf} does not fit "
                                       f"{_dtype_name(spec.dtype)}")
                converted.append(leaf)
            else:
                if isinstance(leaf, bool) or not isinstance(leaf, (int, float)):
                    raise RequestError(400, f"Input {where} must be a number "
                                       f"({_dtype_name(spec.dtype)}); received a "
                                       f"{_json_type(leaf)}")
                converted.append(leaf)
        array = np.array(converted, dtype=object if is_string else spec.dtype.as_numpy_dtype)
        return array.reshape(shape)

    def _string(self, leaf, where):
        if _is_b64(leaf):
            try:
                data = base64.b64decode(leaf["b64"], validate=True)
            except (ValueError, TypeError):
                raise RequestError(400, f"Input {where}: `b64` is not valid base64") from None
            length = len(data)
        elif isinstance(leaf, str):
            data, length = leaf.encode("utf-8", "surrogatepass"), len(leaf)
        else:
            raise RequestError(400, f"Input {where} must be a string (the text); received a "
                               f"{_json_type(leaf)}")
        if length > self.max_text_chars:
            raise RequestError(400, f"Input {where} has {length} characters; this server takes "
                               f"at most {self.max_text_chars} (--max-text-chars)")
        return data

    def run(self, signature, inputs):
        """Outputs (numpy) of `signature` on numpy `inputs`; model failures as `RequestError`."""
        specs = self.input_specs[signature]
        tensors = {name: tf.constant(value, dtype=specs[name].dtype)
                   for name, value in inputs.items()}
        try:
            outputs = self.signatures[signature](**tensors)
        except tf.errors.InvalidArgumentError as error:
            lines = [line for line in error.message.splitlines()
                     if line.strip() and "Graph execution error" not in line]
            raise RequestError(400, "The model rejected the inputs: "
                               f"{lines[0].strip() if lines else error.message}") from None
        except Exception as error:  # noqa: BLE001 - a model failure must not stop the server
            raise RequestError(500, f"The model failed: {type(error).__name__}: "
                               f"{str(error).splitlines()[0] if str(error) else ''}") from None
        return {name: value.numpy() for name, value in sorted(outputs.items())}


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


Prepared = collections.namedtuple(
    "Prepared", ["signature", "inputs", "columnar", "batch", "request_bytes"])


def _id_limits(signatures, directory):
    """`(sequence_length, vocabulary_size)` of a keras-attn SavedModel (`None` if unknown)."""
    length = vocabulary = None
    if "metadata" in signatures:
        metadata = signatures["metadata"]()
        if "sequence_length" in metadata:
            length = int(metadata["sequence_length"].numpy())
    vocab_file = pathlib.Path(directory) / "assets" / "vocab.txt"
    if vocab_file.is_file():
        with open(vocab_file, "rb") as file:
            vocabulary = sum(1 for _ in file)
    return length, vocabulary


def _json_depth(text):
    """Deepest nesting of `[`/`{` in JSON text, strings skipped (checked before parsing:
    Python's parser recurses once per level)."""
    if "[" not in text and "{" not in text:
        return 0
    # Quoted strings out (escapes included), then the running depth of the brackets left.
    skeleton = re.sub(r'"(?:[^"\\]|\\.)*"', "", text)
    brackets = np.frombuffer(re.sub(r"[^\[\]{}]", "", skeleton).encode("ascii"), np.uint8)
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1)
    return int(np.cumsum(steps).max()) if steps.size else 0


def _json_int(digits):
    if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise RequestError(400, f"The request has an integer of {len(digits)} digits; this "
                           f"server takes at most {MAX_INTEGER_DIGITS}")
    return int(digits)


def _trim_columns(outputs):
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


def _check_padded_size(outputs, prepared):
    """Columnar NER answers are padded to the longest row: a 400 when the answer would pass
    `MAX_ANSWER_GROWTH` x the request + `ANSWER_BYTES_PER_EXAMPLE` per example."""
    limit = MAX_ANSWER_GROWTH * prepared.request_bytes + \
        ANSWER_BYTES_PER_EXAMPLE * (prepared.batch or 1)
    # Each padding value takes >= 4 bytes ('"", ', '-1, '): a lower bound, no JSON needed.
    padding = sum(np.size(outputs[name]) - int(np.sum(outputs[count]))
                  for count, names in COUNTED_OUTPUTS.items() if count in outputs
                  for name in names if name in outputs)
    size = 4 * padding if 4 * padding > limit else len(json.dumps(
        {"outputs": {k: _json_value(v) for k, v in outputs.items()}},
        ensure_ascii=False).encode("utf-8"))
    if size > limit:
        words = int(np.max(outputs.get("num_words", [0]), initial=0))
        raise RequestError(400, f"The columnar answer would have >= {size} bytes: its rows are "
                           f"padded to the longest text ({words} words), and an answer is at "
                           f"most {MAX_ANSWER_GROWTH} x the request's {prepared.request_bytes} "
                           f"bytes + {ANSWER_BYTES_PER_EXAMPLE} per text. Send these texts in "
                           "row format (`instances`: each row lists only its own words), or "
                           "texts of similar lengths together")


def _is_b64(value):
    return isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str)


def _json_type(value):
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "list",
            dict: "object"}.get(type(value), type(value).__name__)


def _shape_text(shape):
    return "[" + ", ".join("-1" if d is None else str(d) for d in shape) + "]"


def _json_value(array):
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


def _rows_of(outputs, batch):
    """Row-format predictions: the outputs split along their first dimension, which must be
    the batch for every output (as TF Serving requires)."""
    for name, value in outputs.items():
        if np.ndim(value) == 0 or np.shape(value)[0] != batch:
            raise RequestError(400, f"Output {json.dumps(name)} has shape "
                               f"{list(np.shape(value))}, not a first dimension of {batch} "
                               "examples: call this signature in columnar format (`inputs`)")
    values = {name: _json_value(value) for name, value in outputs.items()}
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


# --- transport ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """The resource limits of `make_server` (each is a `keras-attn serve` flag).

    Attributes:
        max_request_bytes: largest request body; larger ones get 413 without being read.
        max_header_bytes: largest request line plus headers; larger ones get 400.
        max_connections: most open connections and requests in progress; past it new
            requests get 503.
        backlog: the listen backlog (connections the kernel queues before they are accepted).
        header_timeout: seconds for a request's line and headers to arrive, counted from the
            connection's opening or from the previous response; then the connection is closed.
        request_timeout: seconds for the body, the model work and the answer after the
            headers; past it 408 (body still incomplete) or 504 (answer not ready).
        keep_alive_timeout: seconds an idle keep-alive connection stays open.
        workers: model batches running at once (threads).
        max_batch_size: most examples merged into one model batch; `0` runs every request
            alone.
        batch_timeout: seconds a request waits for others to join its batch.
        max_queued_examples: most examples waiting for the model; past it 503.
    """

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_header_bytes: int = 16_384
    max_connections: int = 256
    backlog: int = 1024
    header_timeout: float = 10.0
    request_timeout: float = 30.0
    keep_alive_timeout: float = 5.0
    workers: int = 2
    max_batch_size: int = 32
    batch_timeout: float = 0.002
    max_queued_examples: int = 2048

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            zero_ok = field.name in ("max_batch_size", "batch_timeout")
            check_number(field.name, value, low=0, include_low=zero_ok)


class _HeadScanner:
    """Follows the request heads of one connection's byte stream (bodies framed by their
    Content-Length) and checks each head's Content-Length strictly: h11 merges identical
    duplicates and lists (`20, 20`) into one value, so the application never sees them."""

    def __init__(self, max_head_bytes):
        self.max_head_bytes = max_head_bytes
        self.head = b""  # the current head, while it arrives
        self.body_left = 0  # bytes of the current body still to come
        self.lost = False  # after a chunked body or a bad head: h11 alone checks the rest

    def feed(self, data):
        """`(error, good)`: the message of the first bad head in `data` (or `None`), and how
        many bytes of `data` come before that head (all of them when none is bad)."""
        offset = 0
        while offset < len(data) and not self.lost:
            if self.body_left:
                skipped = min(self.body_left, len(data) - offset)
                self.body_left -= skipped
                offset += skipped
                continue
            head_start = offset - len(self.head)  # negative: the head began in earlier data
            self.head += data[offset:]
            end = _HEAD_END.search(self.head)
            if (end.end() if end else len(self.head)) > self.max_head_bytes:
                # h11's own limit only covers a head arriving in several pieces.
                self.lost = True
                return (f"The request line and headers have more than {self.max_head_bytes} "
                        "bytes (--max-header-bytes)"), max(head_start, 0)
            if end is None:
                return None, len(data)
            offset = head_start + end.end()
            head, self.head = self.head[:end.start()], b""
            error = self._check(head)
            if error is not None:
                self.lost = True
                return error, max(head_start, 0)
        return None, len(data)

    def _check(self, head):
        lengths = _CONTENT_LENGTH.findall(head)
        if len(lengths) > 1:
            return f"The request has {len(lengths)} Content-Length headers: send exactly one"
        if lengths and not lengths[0].isdigit():
            value = lengths[0].decode("latin-1")[:40]
            return f"Content-Length {value!r} is not a number of bytes: send digits only"
        self.lost = _TRANSFER_ENCODING.search(head) is not None
        self.body_left = int(lengths[0]) if lengths else 0
        return None


_HEAD_END = re.compile(rb"\r?\n\r?\n")
_CONTENT_LENGTH = re.compile(rb"(?im)^content-length[ \t]*:[ \t]*(.*?)[ \t]*\r?$")
_TRANSFER_ENCODING = re.compile(rb"(?im)^transfer-encoding[ \t]*:")


def _protocol_class(limits):
    """uvicorn's h11 protocol with a deadline for each request's line and headers (uvicorn
    only times out idle keep-alive connections, so a client trickling header bytes would
    hold its connection forever), strict Content-Length checks and JSON error bodies."""
    # The optional `serve` extra (keras-attn[serve]); `HttpServer` checks it is there.
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class ServerProtocol(H11Protocol):
        _header_timer = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._heads = _HeadScanner(limits.max_header_bytes)
            self._bad_head = None  # the error of a bad head, answered after earlier requests
            self._arm_header_deadline()

        def data_received(self, data):
            if self._bad_head is not None:
                return  # the connection closes after the 400 of a bad head
            self._bad_head, good = self._heads.feed(data)
            if good:
                super().data_received(data[:good])
            if self._bad_head is not None and not self.transport.is_closing():
                if self.cycle is None or self.cycle.response_complete:
                    self.send_400_response(self._bad_head)
                # else: on_response_complete sends it after the answer under way

        def send_400_response(self, msg):
            """The 400 of a malformed request, as TF Serving's `{"error": ...}`."""
            if msg == "Invalid HTTP request received.":  # uvicorn's words for h11's errors
                msg = ("Malformed HTTP request (request line, headers or Content-Length): "
                       "see RFC 9112")
            data = json.dumps({"error": msg}).encode("utf-8")
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(data)).encode() + b"\r\nConnection: close"
                b"\r\n\r\n" + data)
            self.transport.close()

        def on_response_complete(self):
            super().on_response_complete()
            if self._bad_head is not None and not self.transport.is_closing():
                self.send_400_response(self._bad_head)
            elif not self.transport.is_closing():
                self._arm_header_deadline()

        def connection_lost(self, exc):
            self._header_timer.cancel()
            super().connection_lost(exc)

        def _arm_header_deadline(self):
            waiting_for = self.cycle
            if self._header_timer is not None:
                self._header_timer.cancel()

            def expire():
                if self.cycle is waiting_for and not self.transport.is_closing():
                    self.transport.close()  # no request's headers since the timer was set

            self._header_timer = self.loop.call_later(limits.header_timeout, expire)

    return ServerProtocol


class _App:
    """The ASGI application: reads the request within the limits, routes it through `api`,
    runs predictions through the batcher, answers JSON and logs one line."""

    def __init__(self, api, limits, log):
        self.api = api
        self.limits = limits
        self.log = log
        self.server_state = None  # uvicorn's: the open connections and requests in progress
        self.executor = concurrent.futures.ThreadPoolExecutor(
            limits.workers, thread_name_prefix="keras-attn-model")
        self.batcher = RequestBatcher(
            self._run, self.executor, limits.workers, limits.max_batch_size,
            limits.batch_timeout, limits.max_queued_examples)

    def _run(self, key, inputs):
        return self.api.run(key[0], inputs)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return  # lifespan is off; websockets are not served
        started = time.perf_counter()
        status, response, close = await self._respond(scope, receive)
        data = json.dumps(response, ensure_ascii=False, allow_nan=True).encode("utf-8")
        headers = [(b"Content-Type", b"application/json"),
                   (b"Content-Length", str(len(data)).encode())]
        if status == 405:
            headers.append((b"Allow", b"GET, POST"))
        if close:
            headers.append((b"Connection", b"close"))
        try:
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": data})
        except OSError:
            status = "client gone"  # uvicorn drops writes to a closed connection quietly
        milliseconds = (time.perf_counter() - started) * 1000
        client = (scope.get("client") or ("-",))[0]
        self.log(f'{client} "{scope["method"]} {scope["path"]}" {status} {len(data)} bytes '
                 f"{milliseconds:.1f} ms")

    async def _respond(self, scope, receive):
        """`(status, response dict, close connection)`; never raises."""
        close = False
        state, most = self.server_state, self.limits.max_connections
        if state is not None and (len(state.connections) > most or len(state.tasks) > most):
            return 503, {"error": f"The server is busy: more than {most} connections or "
                         "requests in progress (--max-connections); retry later"}, True
        try:
            async with asyncio.timeout(self.limits.request_timeout):
                try:
                    method, path = scope["method"], scope["path"]
                    verb = self.api.route(method, path) if method in ("GET", "POST") else \
                        self._other_method(method)
                    if verb != ":predict":
                        return (*self.api.handle(method, path, b""), False)
                    close = True  # until the body is read
                    body = await self._body(scope, receive)
                    close = False
                    return 200, await self._predict(body, receive), False
                except RequestError as error:
                    return error.status, {"error": error.message}, close
        except TimeoutError:
            if close:
                return 408, {"error": "The request body did not arrive within "
                             f"{self.limits.request_timeout:g} s (--request-timeout)"}, True
            return 504, {"error": "The answer was not ready within "
                         f"{self.limits.request_timeout:g} s (--request-timeout)"}, False
        except Exception as error:  # noqa: BLE001 - whatever happens, answer and stay up
            return 500, {"error": f"Internal error: {type(error).__name__}: {error}"}, close

    def _other_method(self, method):
        raise RequestError(405, f"{method} is not allowed: use GET (status, metadata) or POST "
                           "(:predict)")

    async def _body(self, scope, receive):
        lengths = [v for k, v in scope["headers"] if k == b"content-length"]
        if lengths and any(k == b"transfer-encoding" for k, _ in scope["headers"]):
            raise RequestError(400, "The request has both Content-Length and "
                               "Transfer-Encoding: send Content-Length only")
        if not lengths:
            raise RequestError(411, "Send the request body with a Content-Length header "
                               "(chunked bodies are not supported)")
        length = int(lengths[0])  # h11 has checked it: digits only, duplicates equal
        limit = self.limits.max_request_bytes
        if length > limit:
            raise RequestError(413, f"The request body has {length} bytes; this server takes "
                               f"at most {limit} (--max-request-bytes): send fewer texts")
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestError(499, "The client closed the connection")
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _predict(self, body, receive):
        prepared = self.api.prepare(body)
        key, mergeable = self.api.batch_key(prepared)
        work = asyncio.ensure_future(self.batcher.submit(key, prepared.inputs, mergeable))
        gone = asyncio.ensure_future(receive())  # returns only when the client disconnects
        try:
            await asyncio.wait([work, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()  # client gone or deadline: if not started, never started
        if work.cancelled():
            raise RequestError(499, "The client closed the connection")
        try:
            outputs = work.result()
        except QueueFullError as error:
            raise RequestError(503, f"The server is busy: {error}; retry later") from None
        return self.api.answer(prepared, outputs)


class HttpServer:
    """`keras-attn serve`'s HTTP server: uvicorn on a socket bound at construction.

    `serve_forever()` runs it (in the calling thread, until `shutdown()` or Ctrl-C);
    `server_address` is `(host, port)`; `server_close()` closes the socket.
    """

    def __init__(self, api, host, port, limits, log):
        try:  # imported on use: the optional `serve` extra (keras-attn[serve])
            import uvicorn
        except ImportError:
            raise ImportError("`keras-attn serve` runs on uvicorn: pip install "
                              "'keras-attn[serve]'") from None
        self.api = api
        self.limits = limits
        self.app = _App(api, limits, log)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
        # and without it each answer's body waits for the client's delayed ACK (~40 ms).
        self.socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
        except OSError:
            self.socket.close()
            raise
        self.socket.listen(limits.backlog)  # connections queue from now on, served once running
        self.server_address = self.socket.getsockname()[:2]
        config = uvicorn.Config(
            self.app, http=_protocol_class(limits), lifespan="off",
            log_config=None, access_log=False, log_level="warning",
            backlog=limits.backlog, timeout_keep_alive=limits.keep_alive_timeout,
            h11_max_incomplete_event_size=limits.max_header_bytes,
            timeout_graceful_shutdown=limits.request_timeout, server_header=False)
        self.server = uvicorn.Server(config)
        # The connection limit is the app's (uvicorn's limit_concurrency answers plain text).
        self.app.server_state = self.server.server_state
        self._stopped = threading.Event()

    def serve_forever(self):
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.app.executor.shutdown(wait=False, cancel_futures=True)
            self._stopped.set()

    def shutdown(self):
        """Stops `serve_forever` (running in another thread) and waits for it."""
        self.server.should_exit = True
        self._stopped.wait(timeout=self.limits.request_timeout + 5)

    def server_close(self):
        self.socket.close()


def make_server(api, host="127.0.0.1", port=8501, max_request_bytes=DEFAULT_MAX_REQUEST_BYTES,
                log=None, limits=None):
    """An HTTP server answering with `api` (a `RestApi`); bound, not yet serving.

    Call `serve_forever()` (in a thread, or the main thread until Ctrl-C) and `shutdown()`.
    `port=0` takes a free port: read it from `server.server_address[1]`.

    Args:
        api: `RestApi`.
        host: str, address to listen on (`"0.0.0.0"` for every interface).
        port: int.
        max_request_bytes: int, largest request body read; larger ones get 413.
        log: callable receiving one line per request, or `None`.
        limits: `ServerLimits` (its `max_request_bytes` is replaced by the argument's).

    Returns:
        An `HttpServer`.
    """
    check_positive_int("max_request_bytes", max_request_bytes)
    limits = dataclasses.replace(limits or ServerLimits(), max_request_bytes=max_request_bytes)
    return HttpServer(api, host, port, limits, log or (lambda line: None))


def serve_in_thread(server):
    """Starts `server.serve_forever()` in a daemon thread, returns the thread once the server
    accepts connections."""
    thread = threading.Thread(target=server.serve_forever, name="keras-attn-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    return thread


def url_of(server, api):
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/v1/models/{api.model_name}"
