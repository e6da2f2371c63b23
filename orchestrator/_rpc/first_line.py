"""The first line of a connection: an HTTP request refused, an ``auth`` request checked (D30).

Theory of operation. The first line decides whether a connection goes on. One that looks like an
HTTP request (a browser's ``POST`` with a ``text/plain`` body, which any web page may send to a
local port) is answered with an HTTP ``400``, and nothing else is read. On a connection that
must authenticate (TCP) the first line must be
``{"jsonrpc":"2.0","id":…,"method":"auth","params":{"token":…}}`` with the server's token;
anything else gets one ``-32006`` line, which names what was wrong, and the connection is closed
before any session is touched. The connection (``connection.py``) reads the line, with its small
limit and deadline; this module only judges it.
"""

from __future__ import annotations

import hmac
import re
from typing import Any

from orchestrator._rpc.errors import UNAUTHORIZED, RpcError
from orchestrator._rpc.protocol import decode, encode, error_line, success, valid_id
from orchestrator._rpc.transport import Overlong

AUTH_METHOD = "auth"
_HTTP_REQUEST_LINE = re.compile(rb"^[A-Za-z]{3,16} \S+ HTTP/\d")
_HTTP_BODY = b"This is a JSON-RPC server (one JSON message per line), not an HTTP server.\r\n"
HTTP_REFUSAL = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(_HTTP_BODY)
    + _HTTP_BODY
)
"""What a line that looks like an HTTP request gets, before the connection closes."""
_NO_ID = object()


def is_http_request(line: bytes | Overlong | None) -> bool:
    """Whether ``line`` looks like the request line of HTTP (``POST / HTTP/1.1``)."""
    return isinstance(line, bytes) and _HTTP_REQUEST_LINE.match(line) is not None


def authenticate(token: str, line: bytes | Overlong | None) -> tuple[bool, bytes]:
    """Judge the first line of a connection that must authenticate with ``token``.

    Returns:
        ``(True, the line of {"authenticated": true})`` when it is an ``auth`` request with the
        token, else ``(False, the -32006 line)``. ``line`` is ``None`` when nothing came in time.
    """
    request_id, offered = _auth_request(line)
    # surrogatepass: a token offered with a lone surrogate is compared (and refused), not
    # an encoding error that would drop the connection without its -32006 line.
    if offered is not None and hmac.compare_digest(
        offered.encode("utf-8", "surrogatepass"), token.encode("utf-8", "surrogatepass")
    ):
        # A token is only taken from a request with an id (_auth_request): it has an answer.
        return True, (encode(success(request_id, {"authenticated": True})) + "\n").encode()
    message = (
        "Unauthorized: the first request must be "
        '{"jsonrpc":"2.0","id":1,"method":"auth","params":{"token":"<the server\'s token>"}}'
    )
    if line is None:
        message = "Unauthorized: no token sent in time"
    elif offered is not None:
        # An auth request as asked, with another token: telling its sender to send an auth
        # request sent them looking for a format mistake that was not there.
        message = "Unauthorized: wrong token (the server's is in its token file)"
    reply_id = None if request_id is _NO_ID else request_id
    return False, error_line(UNAUTHORIZED, message, reply_id)


def _auth_request(line: bytes | Overlong | None) -> tuple[Any, str | None]:
    """The id and token of an ``auth`` request line (the token is ``None`` when it is not one)."""
    if not isinstance(line, bytes):
        return _NO_ID, None
    try:
        message = decode(line)
    except RpcError:
        return _NO_ID, None
    if not isinstance(message, dict):
        return _NO_ID, None
    request_id = message.get("id", _NO_ID)
    if request_id is not _NO_ID and not valid_id(request_id):
        # Not a request whose answer could name it (true, 1e400): refused with id null, as
        # every other request with such an id is (-32600 there; here, not the auth request).
        return None, None
    params = message.get("params")
    if not isinstance(params, dict):
        return request_id, None
    token = params.get("token")
    if (
        message.get("jsonrpc") != "2.0"
        or message.get("method") != AUTH_METHOD
        or not isinstance(token, str)
        # Held to the rules of every other method: no parameter but the token, and an id, so
        # the client hears {"authenticated": true} (a notification authenticated in silence,
        # and a client waiting for that answer waited for ever).
        or set(params) != {"token"}
        or request_id is _NO_ID
    ):
        return request_id, None
    return request_id, token
