"""Local control endpoints: addresses, and JSON-lines requests over them (numpy-free, stdlib only).

The switch daemon's control port (``cais-switch --control``) and the ranks' coordinator speak the same
framing: one JSON object per line each way, a request ``{"op": ..., ...}`` answered by
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``.

An address is a Unix socket path (``/run/cais/switch.sock`` or ``unix:/run/...``; these also reach across
network namespaces, which share the file system) or ``HOST:PORT`` / ``tcp:HOST:PORT`` for TCP. Only
loopback TCP addresses are accepted for listening: the control port programs the switch and is not
authenticated (the coordinator may listen on another address for ranks on other hosts: a management
network).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time

__all__ = ["Address", "parse_address", "JsonLines", "EndpointError", "RefusedError", "connect", "listen",
           "read_token"]


class EndpointError(ConnectionError):
    """A control endpoint could not be reached, closed, or answered with an error."""


class RefusedError(EndpointError):
    """The endpoint answered, with ``ok`` false (the connection is fine)."""


class Address:
    """A parsed endpoint address.

    Members
    -------
    family : int
        ``socket.AF_UNIX`` or ``socket.AF_INET``.
    target : str | tuple[str, int]
        The socket path, or (host, port).
    """

    def __init__(self, family: int, target):
        self.family, self.target = family, target

    def __str__(self) -> str:
        return self.target if self.family == socket.AF_UNIX else f"{self.target[0]}:{self.target[1]}"


def parse_address(text: str) -> Address:
    """``/path``, ``unix:/path``, ``HOST:PORT`` or ``tcp:HOST:PORT``; ValueError with the reason otherwise."""
    text = str(text).strip()
    if text.startswith("unix:"):
        text = text[5:]
        if not text:
            raise ValueError("unix: needs a socket path")
        return Address(socket.AF_UNIX, text)
    if text.startswith("/") or text.startswith("./"):
        return Address(socket.AF_UNIX, text)
    if text.startswith("tcp:"):
        text = text[4:]
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r}: expected a socket path (/...) or HOST:PORT")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"{text!r}: port {port!r} is not a number") from None
    if not 0 < number < 65536:
        raise ValueError(f"{text!r}: port {number} is not in 1..65535")
    return Address(socket.AF_INET, (host, number))


def listen(address: Address, *, loopback_only: bool = True) -> socket.socket:
    """A listening socket on `address` (a stale Unix socket file is replaced; TCP only on loopback
    unless `loopback_only` is False: the ranks' coordinator, which ranks on other hosts reach)."""
    if address.family == socket.AF_UNIX:
        try:
            os.unlink(address.target)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        host = address.target[0]
        if loopback_only and host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"{address}: the control endpoint listens on loopback only (127.0.0.1)")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address.target)
        sock.listen(64)
    except OSError as e:
        sock.close()
        busy = " (another program listens there: stop it or choose another address)" \
            if e.errno == errno.EADDRINUSE else ""
        error = OSError(f"cannot listen on {address}: {e.strerror or e}{busy}")
        error.errno = e.errno
        raise error from None
    return sock


class JsonLines:
    """Request/response over a connected stream socket: one JSON object per line.

    Members
    -------
    sock : socket.socket
        The connection (blocking, with the timeout given).
    token : str | None
        Sent as ``"token"`` with every request when set (the controller service's shared secret).
    """

    def __init__(self, sock: socket.socket, timeout: float | None = None, name: str = "endpoint",
                 token: str | None = None):
        self.sock, self.name, self.token = sock, name, token
        self.sock.settimeout(timeout)
        self._buf = b""

    def send(self, obj) -> None:
        self.sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def recv(self):
        """The next object; EndpointError when the peer closed or went silent past the timeout."""
        while b"\n" not in self._buf:
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                raise EndpointError(f"{self.name}: no answer within {self.sock.gettimeout()} s") from None
            except OSError as e:
                raise EndpointError(f"{self.name}: {e.strerror or e}") from None
            if not data:
                raise EndpointError(f"{self.name}: the connection was closed")
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, op: str, **fields):
        """Send a request and return its answer; an answer with ``ok`` false raises EndpointError."""
        try:
            self.send({"op": op, **fields, **({"token": self.token} if self.token else {})})
        except OSError as e:
            raise EndpointError(f"{self.name}: {e.strerror or e}") from None
        reply = self.recv()
        if not reply.get("ok"):
            raise RefusedError(f"{self.name}: {op}: {reply.get('error', 'refused')}")
        return reply

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def connect(address: Address | str, *, timeout: float = 10.0, retry_for: float = 0.0,
            name: str = "endpoint", token: str | None = None) -> JsonLines:
    """Connect to `address`, retrying for up to `retry_for` seconds while nobody listens yet (a peer
    still starting); EndpointError naming the address after that."""
    address = parse_address(address) if isinstance(address, str) else address
    deadline = time.monotonic() + retry_for
    while True:
        sock = socket.socket(address.family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(address.target)
            return JsonLines(sock, timeout, name=f"{name} {address}", token=token)
        except OSError as e:
            sock.close()
            if time.monotonic() >= deadline:
                why = e.strerror or str(e)
                raise EndpointError(f"{name} {address}: cannot connect ({why})"
                                    + (f" within {retry_for:g} s" if retry_for else "")) from None
            time.sleep(0.05)


def read_token(path: str | None) -> str | None:
    """The controller service's shared secret: the file `path` (stripped), else ``CAIS_TOKEN``; None when
    neither is given, ValueError when it is empty."""
    if path:
        with open(path) as f:
            text = f.read()
    else:
        text = os.environ.get("CAIS_TOKEN")
    if text is None:
        return None
    text = text.strip()
    if not text:
        raise ValueError(f"the token {'in ' + path if path else 'CAIS_TOKEN'} is empty")
    return text
