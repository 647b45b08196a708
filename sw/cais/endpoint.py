"""Local control endpoints: addresses, and JSON-lines requests over them (numpy-free, stdlib only).

The switch daemon's control port (``cais-switch --control``) and the ranks' coordinator speak the same
framing: one JSON object per line each way, a request ``{"op": ..., ...}`` answered by
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``.

An address is a Unix socket path (``/run/cais/switch.sock`` or ``unix:/run/...``; these also reach across
network namespaces, which share the file system) or ``HOST:PORT`` / ``tcp:HOST:PORT`` for TCP. Only
loopback TCP addresses are accepted for listening: the switch's control port has no token, its peers are
checked by uid (:func:`peer_uid`) instead (the coordinator may listen on another address for ranks on other
hosts: a management network; it wants a token).

This module also holds what every server of the package shares against hostile clients (docs/security.md):
Unix sockets created 0600 and never over a file that is not a socket (:func:`listen`); the owner check a
client makes before it sends a token (:func:`server_uid`); lines capped at :data:`MAX_LINE` bytes and
requests at :data:`MAX_DEPTH` levels of nesting (:class:`LineBuffer`, :func:`decode`); plain integers
(:func:`need_int`); a connection cap (:class:`Gate`), an accept that backs off on EMFILE
(:func:`accept_backoff`) and the HTTP server built from them (:class:`GuardedHTTPServer`); private folders
and files (:func:`private_dir`, :func:`open_private`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
import struct
import sys
import threading
import time
from http.server import ThreadingHTTPServer

__all__ = ["Address", "parse_address", "JsonLines", "EndpointError", "RefusedError", "connect", "listen",
           "read_token", "MAX_LINE", "MAX_DEPTH", "ANSWER_MAX_DEPTH", "MAX_CONNECTIONS", "AUTH_IDLE_S", "HTTP_IDLE_S", "LineBuffer",
           "decode", "need_int", "peer_uid", "server_uid", "trusted_uid", "check_listener", "Gate",
           "accept_backoff", "GuardedHTTPServer", "private_dir", "open_private", "printable", "WarningLimiter",
           "WARN_INTERVAL_S"]

log = logging.getLogger("cais.endpoint")

MAX_LINE = 1 << 20        # bytes of one JSON line, either way (the largest answer, info, is a few KiB)
MAX_DEPTH = 8             # nesting of a request's JSON (the deepest legitimate one, rejoin, has 3)
ANSWER_MAX_DEPTH = 64     # nesting of an answer a client reads (stats and job listings nest deeper than requests)
MAX_CONNECTIONS = 128     # connections a server keeps at once; more are closed at once
AUTH_IDLE_S = 10.0        # a connection must send its first request within this (no token, no long wait)
HTTP_IDLE_S = 30.0        # an HTTP connection idle this long is closed
WARN_INTERVAL_S = 10.0    # at most one warning per this many seconds for refusals a stranger can cause
ACCEPT_BACKOFF_S = 0.1    # a server out of file descriptors stops accepting this long
_NO_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


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


def _stale_socket(path: str) -> None:
    """Remove the Unix socket at `path` if nobody listens there; refuse a file that is not a socket, and a
    socket somebody still answers on (listen() never deletes anything else, nor a live endpoint)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        error = OSError(f"cannot listen on {path}: it exists and is not a socket (not replaced)")
        error.errno = errno.EEXIST
        raise error
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)            # stale: its server is gone
        return
    finally:
        probe.close()
    error = OSError(f"cannot listen on {path}: another program listens there (stop it or choose another address)")
    error.errno = errno.EADDRINUSE
    raise error


def listen(address: Address, *, loopback_only: bool = True) -> socket.socket:
    """A listening socket on `address`: a Unix socket created mode 0600 whatever the umask (a stale socket
    file is replaced, any other file refused); TCP only on loopback unless `loopback_only` is False (the
    ranks' coordinator, which ranks on other hosts reach)."""
    if address.family == socket.AF_UNIX:
        _stale_socket(address.target)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        os.fchmod(sock.fileno(), 0o600)      # Linux creates the file with the socket's mode (less the umask)
    else:
        host = address.target[0]
        if loopback_only and host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"{address}: the control endpoint listens on loopback only (127.0.0.1)")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address.target)
        if address.family == socket.AF_UNIX:
            os.chmod(address.target, 0o600)
        sock.listen(64)
    except OSError as e:
        sock.close()
        busy = " (another program listens there: stop it or choose another address)" \
            if e.errno == errno.EADDRINUSE else ""
        error = OSError(f"cannot listen on {address}: {e.strerror or e}{busy}")
        error.errno = e.errno
        raise error from None
    return sock


# ---------------------------------------------------------------------- who is at the other end
def _proc_tcp_uid(local: tuple, remote: tuple | None) -> int | None:
    """The uid owning the TCP socket of this network namespace bound at `local` (host, port) and connected
    to `remote` (None: listening there, on that address or any), from /proc/net/tcp; None if none is."""
    def key(host: str, port: int) -> str:
        return f"{struct.unpack('=I', socket.inet_aton(host))[0]:08X}:{port:04X}"
    try:
        host = socket.gethostbyname(local[0])
        want_local = {key(host, local[1])} | ({key("0.0.0.0", local[1])} if remote is None else set())
        want_remote = key(socket.gethostbyname(remote[0]), remote[1]) if remote else None
        with open("/proc/net/tcp") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        cols = line.split()
        if len(cols) < 8 or cols[1] not in want_local:
            continue
        if (remote is None and cols[3] == "0A") or (remote is not None and cols[2] == want_remote):
            return int(cols[7])
    return None


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of an accepted connection: SO_PEERCRED on a Unix socket,
    /proc/net/tcp on loopback TCP; None when it cannot be known (TCP from another host)."""
    if sock.family == socket.AF_UNIX:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[1]
    if sock.family == socket.AF_INET:
        try:
            return _proc_tcp_uid(sock.getpeername(), sock.getsockname())
        except OSError:
            return None
    return None


def server_uid(sock: socket.socket, address: Address) -> int | None:
    """The uid of the server `sock` is connected to: SO_PEERCRED on a Unix socket, the owner of the loopback
    TCP listener; None when it cannot be known (a server on another host)."""
    if address.family == socket.AF_UNIX:
        return peer_uid(sock)
    if address.target[0] in ("127.0.0.1", "localhost"):
        return _proc_tcp_uid(address.target, None)
    return None


def check_listener(host: str, port: int, name: str) -> None:
    """Before a token goes to HOST:PORT over TCP (cais-cli's HTTP): EndpointError when the loopback
    listener there belongs to neither root nor this user (another user listened first)."""
    if host in ("127.0.0.1", "localhost"):
        uid = _proc_tcp_uid((host, port), None)
        if not trusted_uid(uid):
            raise EndpointError(f"{name} {host}:{port}: the server there runs as uid {uid}, neither root nor this "
                                f"user (uid {os.geteuid()}): not sending it the token")


def trusted_uid(uid: int | None) -> bool:
    """Root and this process's own user are trusted peers; unknown (None: another host) is left to the token."""
    return uid is None or uid in (0, os.geteuid())


# ---------------------------------------------------------------------- bounded input
class LineBuffer:
    """Bytes in, complete lines out, each at most `limit` bytes (ValueError past it); every byte is scanned
    once, so a long line costs linear time.

    Members
    -------
    limit : int
    """

    def __init__(self, limit: int = MAX_LINE):
        self.limit = limit
        self._buf = bytearray()
        self._scanned = 0

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        lines, start = [], 0
        while True:
            end = self._buf.find(b"\n", max(start, self._scanned))
            if end < 0:
                break
            if end - start > self.limit:
                raise ValueError(f"a line longer than {self.limit} bytes")
            lines.append(bytes(self._buf[start:end]))
            start = end + 1
        del self._buf[:start]
        self._scanned = len(self._buf)
        if len(self._buf) > self.limit:
            raise ValueError(f"a line longer than {self.limit} bytes")
        return lines

    def __len__(self) -> int:
        return len(self._buf)


def _depth(obj) -> int:
    deepest, todo = 0, [(obj, 1)]
    while todo:
        item, d = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, d)
            todo.extend((v, d + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def decode(line: bytes, max_depth: int = MAX_DEPTH) -> dict:
    """One request line -> its JSON object; ValueError (one line) for anything else: not JSON, not an
    object, longer than MAX_LINE, nested deeper than `max_depth`."""
    if len(line) > MAX_LINE:
        raise ValueError(f"a line longer than {MAX_LINE} bytes")
    try:
        obj = json.loads(line)
    except RecursionError:
        raise ValueError(f"nested deeper than {max_depth} levels") from None
    except ValueError as e:
        raise ValueError(f"not JSON ({str(e)[:80]})") from None
    if not isinstance(obj, dict):
        raise ValueError("a request is a JSON object")
    if _depth(obj) > max_depth:
        raise ValueError(f"nested deeper than {max_depth} levels")
    return obj


def printable(text, limit: int = 200) -> str:
    """``text`` safe for a log line: control characters (ANSI escapes, newlines) and other unprintable ones
    as ``\\xNN`` / ``\\uNNNN`` escapes, cut to `limit` characters (what a client sent, before its token was
    checked, must not drive the operator's terminal or forge log lines)."""
    text = str(text)
    out = "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                  for c in text[:limit])
    return out + ("..." if len(text) > limit else "")


class WarningLimiter:
    """At most one warning per `interval_s` for an event anybody can cause (a refused token): :meth:`allow`
    says whether to log this one, and how many were kept quiet since the last.

    Members
    -------
    interval_s : float
    clock : callable
        Seconds (``time.monotonic``; a test gives its own).
    suppressed : int
        Events not logged since the last warning.
    """

    def __init__(self, interval_s: float = WARN_INTERVAL_S, clock=time.monotonic):
        self.interval_s, self.clock = interval_s, clock
        self.suppressed = 0
        self._next = None
        self._lock = threading.Lock()

    def allow(self) -> int | None:
        """None: do not log this one; else log it, with the returned count of events kept quiet before it."""
        with self._lock:
            now = self.clock()
            if self._next is not None and now < self._next:
                self.suppressed += 1
                return None
            self._next, quiet, self.suppressed = now + self.interval_s, self.suppressed, 0
            return quiet


_MISSING = object()


def need_int(req: dict, key: str, lo: int, hi: int, default=_MISSING) -> int:
    """``req[key]`` as a plain JSON integer in lo..hi (no float, string, boolean or list); ValueError naming
    the field otherwise."""
    value = req.get(key, default)
    if value is _MISSING:
        raise ValueError(f"{key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}={_short(value)}: must be an integer")
    if not lo <= value <= hi:
        raise ValueError(f"{key}={_short(value)}: not in {lo}..{hi}")
    return value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------------- bounded servers
class Gate:
    """At most `limit` connections at once: :meth:`enter` is False past it (close the new one).

    Members
    -------
    limit : int
    """

    def __init__(self, limit: int = MAX_CONNECTIONS):
        self.limit = limit
        self._sem = threading.BoundedSemaphore(limit)

    def enter(self) -> bool:
        return self._sem.acquire(blocking=False)

    def leave(self) -> None:
        self._sem.release()


def accept_backoff(server: socket.socket, what: str):
    """``server.accept()``; on EMFILE and its kin: log, sleep ACCEPT_BACKOFF_S and return None (the server
    goes on once descriptors are free again). Other errors (the socket closed) raise."""
    try:
        return server.accept()
    except OSError as e:
        if e.errno not in _NO_FDS:
            raise
        log.warning("%s: cannot accept a connection (%s); backing off %g s", what, os.strerror(e.errno),
                    ACCEPT_BACKOFF_S)
        time.sleep(ACCEPT_BACKOFF_S)
        return None


class GuardedHTTPServer(ThreadingHTTPServer):
    """The standard library's threaded HTTP server with a connection cap (:class:`Gate`: a connection past
    it is closed at once) and an accept that backs off on EMFILE instead of spinning. Give the handler a
    ``timeout`` (HTTP_IDLE_S) so that idle connections end."""

    daemon_threads = True
    # listen()'s backlog: the standard library's 5 makes a burst of connections wait for SYN retransmits
    # (1 s, then 3 s, ...) while the accept thread is not scheduled; the cap, not the backlog, bounds them
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, *args, max_connections: int = MAX_CONNECTIONS, **kw):
        super().__init__(*args, **kw)
        self.gate = Gate(max_connections)

    def get_request(self):
        got = accept_backoff(self.socket, "http")
        if got is None:
            raise OSError(errno.EMFILE, "out of file descriptors")
        return got

    def process_request(self, request, client_address):
        if not self.gate.enter():
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.gate.leave()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.gate.leave()


# ---------------------------------------------------------------------- private files
def private_dir(path) -> None:
    """Create folder `path` mode 0700, or accept an existing one only if it is a real folder (not a
    symbolic link) owned by this user (then made 0700); OSError naming the owner otherwise."""
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, f"{path}: not a folder (a symbolic link or a file): refused")
    if st.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"{path}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): "
                                   f"refused (remove it or choose another folder)")
    os.chmod(path, 0o700)


def open_private(path) -> int:
    """A file descriptor for writing `path` from its start, mode 0600: created if absent; an existing one
    only if it is a regular file of this user with one link (then truncated). Never follows a symbolic link."""
    path = os.fspath(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            raise OSError(errno.EPERM, f"{path}: not a regular file of this user (uid {st.st_uid}, "
                                       f"{st.st_nlink} links): refused")
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
        self._lines = LineBuffer()
        self._ready: list[bytes] = []

    def send(self, obj) -> None:
        self.sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def recv(self):
        """The next object; EndpointError when the peer closed or went silent past the timeout."""
        while not self._ready:
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                raise EndpointError(f"{self.name}: no answer within {self.sock.gettimeout()} s") from None
            except OSError as e:
                raise EndpointError(f"{self.name}: {e.strerror or e}") from None
            if not data:
                raise EndpointError(f"{self.name}: the connection was closed")
            try:
                self._ready += self._lines.feed(data)
            except ValueError as e:
                raise EndpointError(f"{self.name}: {e}") from None
        line = self._ready.pop(0)
        try:
            return decode(line, max_depth=ANSWER_MAX_DEPTH)
        except ValueError as e:
            raise EndpointError(f"{self.name}: {e}") from None

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
        except OSError as e:
            sock.close()
            if time.monotonic() >= deadline:
                why = e.strerror or str(e)
                raise EndpointError(f"{name} {address}: cannot connect ({why})"
                                    + (f" within {retry_for:g} s" if retry_for else "")) from None
            time.sleep(0.05)
            continue
        if token is not None:
            uid = server_uid(sock, address)
            if not trusted_uid(uid):
                sock.close()
                raise EndpointError(f"{name} {address}: the server there runs as uid {uid}, neither root nor this "
                                    f"user (uid {os.geteuid()}): not sending it the token")
        return JsonLines(sock, timeout, name=f"{name} {address}", token=token)


def read_token(path: str | None) -> str | None:
    """The controller service's shared secret: the file `path` (stripped), else ``CAIS_TOKEN``; None when
    neither is given, ValueError when it is empty. A token file other users can read is warned about (one
    line on stderr): whoever reads it may drive the controller."""
    mode = 0
    if path:
        with open(path) as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.read()
    else:
        text = os.environ.get("CAIS_TOKEN")
    if text is None:
        return None
    text = text.strip()
    if not text:
        raise ValueError(f"the token {'in ' + path if path else 'CAIS_TOKEN'} is empty")
    if mode & 0o077:
        print(f"warning: the token file {path} is readable by other users (mode {stat.S_IMODE(mode):04o}): "
              f"chmod 600 {path}", file=sys.stderr)
    return text
