"""A cais-switch daemon in the test process, and raw JSON lines to a control endpoint: what the service,
coordinator and security tests share."""

from __future__ import annotations

import contextlib
import json
import socket
import threading

from cais.params import SwitchParams
from cais.sim.daemon import SwitchDaemon

__all__ = ["in_process_switch", "raw_lines"]


@contextlib.contextmanager
def in_process_switch(sock: str, params: SwitchParams):
    """A SwitchDaemon with no interfaces, its control endpoint at ``sock``, run on a thread; yields it."""
    daemon = SwitchDaemon([], params, control=sock)
    loop = threading.Thread(target=daemon.run, daemon=True, name="switch-loop")
    loop.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        loop.join(5)
        daemon.close()


def raw_lines(sock_path, lines: list[bytes], who: str = "the server") -> list[dict]:
    """Send each line on one Unix-socket connection and read one JSON answer line for each."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(str(sock_path))
    answers, buf = [], b""
    for line in lines:
        s.sendall(line + b"\n")
        while b"\n" not in buf:
            data = s.recv(1 << 16)
            assert data, f"{who} closed the connection after {line[:60]!r}"
            buf += data
        answer, buf = buf.split(b"\n", 1)
        answers.append(json.loads(answer))
    s.close()
    return answers
