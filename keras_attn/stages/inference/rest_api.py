"""TensorFlow Serving's REST API over one SavedModel, without the HTTP transport.

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

The HTTP transport is `http_server`; the JSON values are `rest_values`.

The version is `1`, or the number of the version directory when the path is laid out for TF
Serving (`NAME/1/saved_model.pb`).
"""

import collections
import json
import pathlib
import re

import numpy as np
import tensorflow as tf

from keras_attn.errors import first_line
from keras_attn.export.artifacts import load_saved_model
from keras_attn.layers.validation import check_positive_int
from keras_attn.stages.inference.rest_values import COUNTED_OUTPUTS
from keras_attn.stages.inference.rest_values import MAX_JSON_DEPTH
from keras_attn.stages.inference.rest_values import RequestError
from keras_attn.stages.inference.rest_values import check_padded_size
from keras_attn.stages.inference.rest_values import dtype_name
from keras_attn.stages.inference.rest_values import is_b64
from keras_attn.stages.inference.rest_values import json_depth
from keras_attn.stages.inference.rest_values import json_int
from keras_attn.stages.inference.rest_values import json_type
from keras_attn.stages.inference.rest_values import json_value
from keras_attn.stages.inference.rest_values import rows_of
from keras_attn.stages.inference.rest_values import to_array
from keras_attn.stages.inference.rest_values import trim_columns

DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_REQUEST_BYTES = 1_000_000
DEFAULT_MAX_TEXT_CHARS = 20_000
_ROUTE = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?"
    r"(?P<verb>/metadata|:[A-Za-z]+)?/?$"
)


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


def _tensor_info(spec):
    shape = spec.shape
    return {
        "dtype": dtype_name(spec.dtype),
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
        try:
            self.saved_model = load_saved_model(directory)
        except Exception as error:  # noqa: BLE001 - DecodeError, OSError, tf errors, ...
            raise ValueError(f"{directory}: TensorFlow cannot load this SavedModel "
                             f"({first_line(error)}); it is damaged or incomplete: re-run "
                             "`keras-attn export`") from None
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
        inputs = {name: to_array(columns[name], spec, name, self.max_text_chars)
                  for name, spec in specs.items()}
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
            outputs = trim_columns(outputs)
            if any(count in outputs for count in COUNTED_OUTPUTS):
                check_padded_size(outputs, prepared)
            values = {k: json_value(v) for k, v in outputs.items()}
            return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
        return {"predictions": rows_of(outputs, prepared.batch)}

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
        depth = json_depth(text)
        if depth > MAX_JSON_DEPTH:
            raise RequestError(400, f"The request nests lists/objects {depth} levels deep; "
                               f"this server takes at most {MAX_JSON_DEPTH}")
        try:
            request = json.loads(text, parse_int=json_int)
        except json.JSONDecodeError as error:
            raise RequestError(400, f"Invalid JSON at line {error.lineno} column "
                               f"{error.colno}: {error.msg}") from None
        if not isinstance(request, dict):
            raise RequestError(400, "The request must be a JSON object such as "
                               f'{{"instances": [...]}}; received a {json_type(request)}')
        return request

    def _rows(self, instances, specs):
        if not isinstance(instances, list):
            raise RequestError(400, f"`instances` must be a list (one entry per example); "
                               f"received a {json_type(instances)}")
        if not instances:
            raise RequestError(400, "`instances` is empty: send at least one example")
        if not specs:
            raise RequestError(400, "This signature takes no inputs: call it in columnar "
                               'format, {"signature_name": ..., "inputs": {}}')
        self._check_batch(len(instances))
        names = list(specs)
        columns = {name: [] for name in names}
        for index, instance in enumerate(instances):
            if isinstance(instance, dict) and not is_b64(instance):
                self._check_names(instance, names, f"instances[{index}]")
                for name in names:
                    columns[name].append(instance[name])
            elif len(names) == 1:
                columns[names[0]].append(instance)
            else:
                raise RequestError(400, f"instances[{index}] must be an object with the inputs "
                                   f"{names}; received a {json_type(instance)}")
        return columns, len(instances)

    def _columns(self, inputs, specs):
        names = list(specs)
        if isinstance(inputs, dict) and not is_b64(inputs):
            self._check_names(inputs, names, "inputs")
            columns = dict(inputs)
        elif len(names) == 1:
            columns = {names[0]: inputs}
        else:
            raise RequestError(400, f"`inputs` must be an object with the inputs {names}; "
                               f"received a {json_type(inputs)}")
        batch = None
        for name in names:
            if specs[name].shape.rank:
                if not isinstance(columns[name], list):
                    raise RequestError(400, f"inputs[{json.dumps(name)}] must be a list (a "
                                       f"batch); received a {json_type(columns[name])}")
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
