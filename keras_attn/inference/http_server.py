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
`max_text_chars` and a batch larger than `max_batch`; 404 for an unknown model, version or
route; 405 for a wrong HTTP method; 411 without `Content-Length`; 413 for a body larger than
`max_request_bytes` (not read); 500 when the model itself fails. No request can stop the
server: every handler error becomes a response.

The version is `1`, or the number of the version directory when the path is laid out for TF
Serving (`NAME/1/saved_model.pb`).
"""

import base64
import http.server
import json
import pathlib
import re
import threading
import time

import numpy as np

DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_REQUEST_BYTES = 1_000_000
DEFAULT_MAX_TEXT_CHARS = 20_000
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
    from tensorflow.core.framework import types_pb2

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
        for name, value in (("max_batch", max_batch), ("max_text_chars", max_text_chars)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        if not isinstance(model_name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", model_name):
            raise ValueError("`model_name` must be letters, digits, '_', '.' or '-' (it is part "
                             f"of the URL). Received: model_name={model_name!r}")
        from keras_attn.export.serving_module import load_saved_model

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

    # --- routing ----------------------------------------------------------------------------

    def handle(self, method, path, body):
        """`(status, response dict)` of one request. Never raises."""
        try:
            return 200, self._route(method, path.split("?", 1)[0], body)
        except RequestError as error:
            return error.status, {"error": error.message}

    def _route(self, method, path, body):
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
        if verb is None:
            return self.status()
        if verb == "/metadata":
            return self.metadata()
        return self.predict(body)

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
        tensors = {name: self._tensor(columns[name], spec, name)
                   for name, spec in specs.items()}
        outputs = self._call(signature, tensors)
        if "inputs" in request:
            values = {k: _json_value(v) for k, v in outputs.items()}
            return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
        return {"predictions": _rows_of(outputs, batch)}

    def _parse(self, body):
        if not body:
            raise RequestError(400, "Empty request body: send a JSON object such as "
                               '{"instances": ["some text"]}')
        try:
            request = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise RequestError(400, f"The request body is not UTF-8 (byte {error.start})") \
                from None
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

    def _tensor(self, value, spec, name):
        """The request value of input `name` as a tensor of `spec`'s dtype and rank."""
        import tensorflow as tf

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
        return tf.constant(array.reshape(shape), dtype=spec.dtype)

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

    def _call(self, signature, tensors):
        import tensorflow as tf

        try:
            outputs = self.signatures[signature](**tensors)
        except tf.errors.InvalidArgumentError as error:
            raise RequestError(400, f"The model rejected the inputs: "
                               f"{error.message.splitlines()[0]}") from None
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
    if len(shape) == depth:
        shape.append(len(value))
    elif len(shape) < depth or shape[depth] != len(value):
        raise RequestError(400, f"Input {json.dumps(name)} is ragged: its lists have different "
                           f"lengths at depth {depth}; pad them to one length")
    for item in value:
        _flatten(item, leaves, shape, depth + 1, name)


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
    return [{name: value[row] for name, value in values.items()} for row in range(batch)]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "keras-attn-serve"
    timeout = 60  # seconds a client may stall mid-request before its connection is closed

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._respond_to("GET", body=b"")

    def do_POST(self):  # noqa: N802
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked" or length is None:
            self.close_connection = True
            return self._send(411, {"error": "Send the request body with a Content-Length "
                                             "header (chunked bodies are not supported)"})
        try:
            length = int(length)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            return self._send(400, {"error": "Invalid Content-Length "
                                             f"{self.headers.get('Content-Length')!r}"})
        limit = self.server.max_request_bytes
        if length > limit:
            self.close_connection = True  # the body is not read
            return self._send(413, {"error": f"The request body has {length} bytes; this "
                                             f"server takes at most {limit} "
                                             "(--max-request-bytes): send fewer texts"})
        self._respond_to("POST", body=self.rfile.read(length))

    def _other(self):
        self.close_connection = True
        self._send(405, {"error": f"{self.command} is not allowed: use GET (status, metadata) "
                                  "or POST (:predict)"})

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _other  # noqa: N815

    def _respond_to(self, method, body):
        try:
            status, response = self.server.api.handle(method, self.path, body)
        except Exception as error:  # noqa: BLE001 - whatever happens, answer and stay up
            status, response = 500, {"error": f"Internal error: {type(error).__name__}: {error}"}
        self._send(status, response)

    def _send(self, status, response):
        data = json.dumps(response, ensure_ascii=False, allow_nan=True).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 405:
            self.send_header("Allow", "GET, POST")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        milliseconds = (time.perf_counter() - self.started) * 1000
        self.server.log(f'{self.client_address[0]} "{self.command} {self.path}" {status} '
                        f"{len(data)} bytes {milliseconds:.1f} ms")

    def parse_request(self):
        self.started = time.perf_counter()
        return super().parse_request()

    def log_request(self, code="-", size="-"):
        pass  # `_send` logs every answered request, with its latency

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        # http.server's own messages: malformed request lines, timeouts.
        self.server.log(format % args)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # a hanging request does not block shutdown


def make_server(api, host="127.0.0.1", port=8501, max_request_bytes=DEFAULT_MAX_REQUEST_BYTES,
                log=None):
    """A threading HTTP server answering with `api` (a `RestApi`); bound, not yet serving.

    Call `serve_forever()` (in a thread, or the main thread until Ctrl-C) and `shutdown()`.
    `port=0` takes a free port: read it from `server.server_address[1]`.

    Args:
        api: `RestApi`.
        host: str, address to listen on (`"0.0.0.0"` for every interface).
        port: int.
        max_request_bytes: int, largest request body read; larger ones get 413.
        log: callable receiving one line per request, or `None`.

    Returns:
        The `http.server.ThreadingHTTPServer`.
    """
    if isinstance(max_request_bytes, bool) or not isinstance(max_request_bytes, int) or \
            max_request_bytes < 1:
        raise ValueError("`max_request_bytes` must be a positive integer. "
                         f"Received: max_request_bytes={max_request_bytes!r}")
    server = _Server((host, port), _Handler)
    server.api = api
    server.max_request_bytes = max_request_bytes
    server.log = log or (lambda line: None)
    return server


def serve_in_thread(server):
    """Starts `server.serve_forever()` in a daemon thread and returns the thread."""
    thread = threading.Thread(target=server.serve_forever, name="keras-attn-serve", daemon=True)
    thread.start()
    return thread


def url_of(server, api):
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/v1/models/{api.model_name}"

