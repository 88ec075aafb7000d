"""The HTTP/1.1 connection handling of `keras-attn serve` (see `http_server`): uvicorn's h11
protocol with a cap on open sockets, a deadline for each request's line and headers, strict
Content-Length checks and JSON error bodies.

Each connection costs one protocol object and its buffers on the event loop (a few KB; no
thread), so idle keep-alive connections and clients that send half a request are cheap to
hold: they count only against `max_connections`, the cap on open sockets, never against the
work limits (queued examples, batches, worker threads) that bound the model's work.
"""

import json
import re

REFUSED_GRACE = 0.5  # seconds a refused connection may take to read its 503
class HeadScanner:
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


def protocol_class(limits, max_connections):
    """uvicorn's h11 protocol with a deadline for each request's line and headers (uvicorn
    only times out idle keep-alive connections, so a client trickling header bytes would
    hold its connection forever), strict Content-Length checks, JSON error bodies, and a cap
    of `max_connections` open sockets: a connection past it gets a 503 and is closed at once,
    before it is read."""
    # The optional `serve` extra (keras-attn[serve]); `HttpServer` checks it is there.
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class ServerProtocol(H11Protocol):
        _header_timer = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._heads = HeadScanner(limits.max_header_bytes)
            self._bad_head = None  # the error of a bad head, answered after earlier requests
            if len(self.connections) > max_connections:
                self._refuse()
                return
            self._arm_header_deadline()

        def _refuse(self):
            """A 503 for a connection past the cap, nothing of it read: the answer, then a
            half-close (closing with the request unread would reset the connection and could
            lose the answer), and the socket closed when the client closes or after
            `REFUSED_GRACE` seconds, whichever comes first."""
            self._bad_head = "refused"  # data_received drops what the client sends
            data = json.dumps({"error": f"The server holds {max_connections} open connections "
                               "(--max-connections): retry later"}).encode("utf-8")
            self.transport.write(_head(503, data) + data)
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(REFUSED_GRACE, self.transport.close)

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
            self.transport.write(_head(400, data) + data)
            self.transport.close()

        def on_response_complete(self):
            super().on_response_complete()
            if self._bad_head is not None and not self.transport.is_closing():
                self.send_400_response(self._bad_head)
            elif not self.transport.is_closing():
                self._arm_header_deadline()

        def connection_lost(self, exc):
            if self._header_timer is not None:
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


def _head(status, data):
    """The status line and headers of a JSON error answer that closes the connection."""
    reason = {400: "Bad Request", 503: "Service Unavailable"}[status]
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode("ascii")
