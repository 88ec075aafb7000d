"""`keras-attn serve`'s HTTP server: TensorFlow Serving's REST API (`rest_api.RestApi`) on
uvicorn, an asyncio HTTP/1.1 server.

One event loop handles every connection (`http_protocol`): an idle keep-alive connection or
one still sending its request costs a few KB and no thread, so thousands are held cheaply,
and they count only against `max_connections`, the cap on open sockets (past it a new
connection gets 503 and is closed at once; the process's open-file limit is raised to fit
the cap). A connection's request line and headers must arrive within `header_timeout`, its
body within `request_timeout`: a client trickling bytes is closed (408 for a body). The work
is bounded apart from the connections: the model runs in `workers` threads fed by a
`RequestBatcher` that merges concurrent requests into batches of at most `max_batch_size`
examples, with at most `max_queued_examples` waiting (past it 503); answers not ready within
`request_timeout` get 504. No request can stop the server: every handler error becomes a
response.
"""

import asyncio
import concurrent.futures
import dataclasses
import json
import socket
import threading
import time

try:
    import resource  # the open-file limit (Unix)
except ImportError:  # Windows: no RLIMIT_NOFILE
    resource = None

from keras_attn.layers.validation import check_number
from keras_attn.layers.validation import check_positive_int
from keras_attn.runs.config_schema import setting
from keras_attn.stages.inference.http_protocol import protocol_class
from keras_attn.stages.inference.request_batcher import QueueFullError
from keras_attn.stages.inference.request_batcher import RequestBatcher
from keras_attn.stages.inference.rest_api import DEFAULT_MAX_REQUEST_BYTES
from keras_attn.stages.inference.rest_api import RequestError

FD_RESERVE = 256  # open files kept for other than client sockets (model files, TF, logs)


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """The resource limits of `make_server` (each is a `keras-attn serve` flag).

    Attributes:
        max_request_bytes: largest request body; larger ones get 413 without being read.
        max_header_bytes: largest request line plus headers; larger ones get 400.
        max_connections: most open sockets (connections), idle keep-alive ones and ones
            still sending their request included; a connection past it gets 503 and is
            closed at once. A connection costs a few KB and no thread, so this cap is high;
            the process's open-file limit is raised to fit it (see `open_file_limit`), and
            when the hard limit is lower the cap is lowered to it.
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

    max_request_bytes: int = setting(
        DEFAULT_MAX_REQUEST_BYTES, minimum=1,
        help="largest request body; larger: 413, not read")
    max_header_bytes: int = setting(
        16_384, minimum=1, help="largest request line plus headers; larger: 400")
    max_connections: int = setting(
        8192, minimum=1,
        help="most open connections, idle and half-sent ones included (each costs a few KB "
             "and no thread); past it a new connection gets 503 and is closed; the open-file "
             "limit is raised to fit it")
    backlog: int = setting(
        1024, minimum=1, help="listen backlog: connections the kernel queues until accepted")
    header_timeout: float = setting(
        10.0,
        help="seconds for a request's line and headers, from the connection's opening or the "
             "previous answer; then the connection is closed")
    request_timeout: float = setting(
        30.0,
        help="seconds for the body, the model work and the answer after the headers; past "
             "it: 408 (body incomplete) or 504")
    keep_alive_timeout: float = setting(
        5.0, help="seconds an idle keep-alive connection stays open")
    workers: int = setting(2, minimum=1, help="model batches run at once, in threads")
    max_batch_size: int = setting(
        32, minimum=0,
        help="most examples of concurrent requests merged into one model batch; 0 runs "
             "every request alone")
    batch_timeout: float = setting(
        0.002, minimum=0.0, flag="--batch-timeout-ms", flag_scale=1000,
        help="milliseconds a request waits for others to join its batch")
    max_queued_examples: int = setting(
        2048, minimum=1, help="most examples waiting for the model; past it: 503")

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            zero_ok = field.name in ("max_batch_size", "batch_timeout")
            check_number(field.name, value, low=0, include_low=zero_ok)

def open_file_limit(wanted):
    """The process's open-file limit (`RLIMIT_NOFILE`) after raising its soft limit to
    `wanted`, at most to the hard limit (`ulimit -Hn`; only root raises that). `None` where
    the platform has no such limit (Windows)."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return wanted if soft == resource.RLIM_INFINITY else soft


def _connection_cap(max_connections, log):
    """`max_connections`, lowered to what the open-file limit leaves after `FD_RESERVE`."""
    files = open_file_limit(max_connections + FD_RESERVE)
    if files is None or files >= max_connections + FD_RESERVE:
        return max_connections
    if files <= 2 * FD_RESERVE:
        raise ValueError(f"This process may open only {files} files (RLIMIT_NOFILE), too few "
                         "to serve: raise the hard limit (ulimit -Hn "
                         f"{max_connections + FD_RESERVE})")
    log(f"--max-connections {max_connections} lowered to {files - FD_RESERVE}: this process "
        f"may open {files} files (hard RLIMIT_NOFILE; raise it with ulimit -Hn)")
    return files - FD_RESERVE


class _App:
    """The ASGI application: reads the request within the limits, routes it through `api`,
    runs predictions through the batcher, answers JSON and logs one line."""

    def __init__(self, api, limits, log):
        self.api = api
        self.limits = limits
        self.log = log
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
        self.max_connections = _connection_cap(limits.max_connections, log)
        config = uvicorn.Config(
            self.app, http=protocol_class(limits, self.max_connections), lifespan="off",
            log_config=None, access_log=False, log_level="warning",
            backlog=limits.backlog, timeout_keep_alive=limits.keep_alive_timeout,
            h11_max_incomplete_event_size=limits.max_header_bytes,
            timeout_graceful_shutdown=limits.request_timeout, server_header=False)
        # The connection cap is the protocol's (uvicorn's limit_concurrency counts requests
        # in progress with the connections and answers plain text).
        self.server = uvicorn.Server(config)
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
