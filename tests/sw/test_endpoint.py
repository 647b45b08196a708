"""Control endpoint addresses and the JSON-lines framing (cais.endpoint), without root."""

import socket
import threading

import pytest

from cais.endpoint import EndpointError, JsonLines, connect, listen, parse_address


@pytest.mark.parametrize("text, family, target", [
    ("/run/cais/switch.sock", socket.AF_UNIX, "/run/cais/switch.sock"),
    ("unix:/tmp/x.sock", socket.AF_UNIX, "/tmp/x.sock"),
    ("./rel.sock", socket.AF_UNIX, "./rel.sock"),
    ("127.0.0.1:7700", socket.AF_INET, ("127.0.0.1", 7700)),
    ("tcp:10.0.0.1:80", socket.AF_INET, ("10.0.0.1", 80)),
])
def test_parse_address(text, family, target):
    a = parse_address(text)
    assert (a.family, a.target) == (family, target)


@pytest.mark.parametrize("text, message", [
    ("nonsense", "expected a socket path"), ("host:port", "is not a number"), ("h:70000", "not in 1..65535"),
    ("unix:", "needs a socket path"), (":80", "expected a socket path"),
])
def test_parse_address_refuses(text, message):
    with pytest.raises(ValueError, match=message):
        parse_address(text)


def test_listen_loopback_only_unless_told():
    with pytest.raises(ValueError, match="loopback only"):
        listen(parse_address("10.255.255.1:7700"))       # refused before any bind
    probe = socket.socket()
    probe.bind(("127.0.0.2", 0))                          # a free port on an address that is not 127.0.0.1
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(ValueError, match="loopback only"):
        listen(parse_address(f"127.0.0.2:{port}"))
    s = listen(parse_address(f"127.0.0.2:{port}"), loopback_only=False)   # the coordinator's case
    assert s.getsockname() == ("127.0.0.2", port)
    s.close()


def test_request_answer_and_errors(tmp_path):
    server = listen(parse_address(str(tmp_path / "s.sock")))

    def serve():
        conn, _ = server.accept()
        peer = JsonLines(conn, 30)
        req = peer.recv()
        peer.send({"ok": True, "echo": req["x"]})
        req = peer.recv()
        peer.send({"ok": False, "error": "no such thing"})
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    c = connect(str(tmp_path / "s.sock"), timeout=30)
    assert c.request("echo", x=[1, 2])["echo"] == [1, 2]
    with pytest.raises(EndpointError, match="thing: no such thing"):
        c.request("thing")
    t.join()
    with pytest.raises(EndpointError, match="closed|Broken pipe"):   # the server has hung up
        c.request("again")
    server.close()


def test_connect_names_the_address_and_gives_up_in_time(tmp_path):
    import time
    t0 = time.monotonic()
    with pytest.raises(EndpointError, match=r"coordinator .*none\.sock: cannot connect .* within 0.3 s"):
        connect(str(tmp_path / "none.sock"), retry_for=0.3, name="coordinator")
    assert time.monotonic() - t0 >= 0.3          # it kept trying for the time it was given (the message says 0.3 s)
