"""cais.init's arguments from torch's (torchrun's) environment when the CAIS_* variables are absent
(docs/torch.md): RANK, WORLD_SIZE, LOCAL_RANK in CAIS_IFACE, MASTER_ADDR for the coordinator; and
init_process_group's checks. The rank's process group is replaced by a recorder: nothing is opened."""

import pytest

import cais
import cais.dist as cd


@pytest.fixture
def recorded(monkeypatch):
    calls = []

    class Recorder:
        def __init__(self, interface, rank, world_size, switch, controller, config, timeout, connect_timeout):
            calls.append(dict(interface=interface, rank=rank, world_size=world_size, switch=switch,
                              controller=controller))
            self.rank, self.world_size, self.outstanding, self._primitives = rank, world_size, [], None

        def close(self):
            pass

    monkeypatch.setattr(cd, "ProcessGroup", Recorder)
    monkeypatch.setattr(cd, "_synchronize", lambda pg: None)
    for name in list(cd.ENV.values()) + list(cd.TORCH_ENV.values()) + ["LOCAL_RANK"]:
        monkeypatch.delenv(name, raising=False)
    yield calls
    cd._pg = None


def _setenv(monkeypatch, **values):
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def test_torchrun_variables_fill_in(recorded, monkeypatch):
    _setenv(monkeypatch, RANK="5", WORLD_SIZE="8", LOCAL_RANK="1", MASTER_ADDR="10.1.2.3",
            CAIS_IFACE="eth{local_rank}")
    cais.init_process_group("cais", init_method="env://")
    assert recorded[-1] == dict(interface="eth1", rank=5, world_size=8, switch=None, controller="10.1.2.3:7700")


def test_cais_variables_win_over_torchs(recorded, monkeypatch):
    _setenv(monkeypatch, RANK="5", CAIS_RANK="2", WORLD_SIZE="8", CAIS_WORLD_SIZE="4", MASTER_ADDR="10.1.2.3",
            CAIS_CONTROLLER="/run/c.sock")
    cais.init("h{rank}")
    assert recorded[-1]["interface"] == "h2" and recorded[-1]["rank"] == 2 and recorded[-1]["world_size"] == 4
    assert recorded[-1]["controller"] == "/run/c.sock"


def test_bad_values_name_the_variable(recorded, monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK='zero'"):
        cais.init("h0", world_size=2)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"only \{rank\} and \{local_rank\}"):
        cais.init("h{node}", world_size=2)
    with pytest.raises(ValueError, match="backend='gloo'"):
        cais.init_process_group("gloo")
    with pytest.raises(ValueError, match="init_method='tcp://"):
        cais.init_process_group("cais", init_method="tcp://10.0.0.1:23456")
    assert recorded == []


def test_torch_tcp_init_puts_the_coordinator_on_the_rendezvous_host(recorded, monkeypatch):
    """init_method="tcp://HOST:PORT" (no MASTER_ADDR in the environment): the coordinator's endpoint is on
    HOST, as with env://, not on Config.controller_address (127.0.0.1)."""
    import socket

    import torch.distributed as dist

    import cais.torch  # noqa: F401 - registers "cais"
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("CAIS_IFACE", "h{rank}")
    dist.init_process_group("cais", init_method=f"tcp://127.0.0.2:{port}", rank=0, world_size=1)
    try:
        assert recorded[-1] == dict(interface="h0", rank=0, world_size=1, switch=None, controller="127.0.0.2:7700")
    finally:
        dist.destroy_process_group()


def test_plain_send_recv_make_their_pair_group_once(monkeypatch):
    """cais.send/recv between two ranks make the two's group (a switch rule) on their first exchange only,
    not on every call. The collectives are replaced: nothing is opened."""
    import types

    import numpy as np

    made = []

    class Rank0:
        rank, world_size, outstanding, _primitives = 0, 2, [], None

    monkeypatch.setattr(cd, "_pg", Rank0())
    monkeypatch.setattr(cd, "new_group", lambda ranks: made.append(list(ranks)) or types.SimpleNamespace(ranks=ranks))
    monkeypatch.setattr(cd.DistPrimitives, "all_reduce", lambda self, arr, op, group=None, dtype=None: "switch")
    monkeypatch.setattr(cd.DistPrimitives, "broadcast", lambda self, arr, src, group=None: None)
    for _ in range(3):
        cais.send(np.zeros(2), dst=1)
        cais.recv(np.zeros(2), src=1)
    assert made == [[0, 1]]
