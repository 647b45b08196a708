"""torch code on the co-simulation: every rank a thread, one switch model, deterministic.

::

    from cais.sim.torch_ranks import run_ranks
    def train(rank):                                   # torch.distributed is initialised with "cais"
        model = DistributedDataParallel(make_model())
        ...
        return model.state_dict()
    states = run_ranks(train, ranks=3)                 # on the reference model (cais.sim.links.model)

:func:`run_ranks` gives each rank thread a torch.distributed world of its own (torch's threaded-world
test support, ``torch.testing._internal.distributed.multi_threaded_pg``) whose default group is the
"cais" backend on that rank's :class:`cais.comm.Communicator`. The switch advances only while every rank
waits in a collective, so a run gives the same frames, and bits, whatever the threads' timing.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch.distributed as tdist

from cais.torch import Options

__all__ = ["run_ranks"]

_lock = threading.Lock()
# torch registers group names in one process-wide table: each rank thread counts its groups from its own
# offset, so that rank threads' "0", "1", ... do not collide
_NAME_OFFSET = 1_000_000


def run_ranks(fn: Callable[[int], Any], ranks: int, link=None, config=None, rank_ports=None,
              check: bool | None = None) -> list[Any]:
    """Run ``fn(rank)`` on `ranks` rank threads, each inside ``init_process_group("cais")`` on the
    co-simulation (`link`: default the reference model with ``max(4, ranks)`` ports; `config`: a
    :class:`cais.config.Config`; `rank_ports`: the switch port of each rank); returns their results."""
    from torch.testing._internal.distributed.multi_threaded_pg import (_install_threaded_pg,
                                                                       _uninstall_threaded_pg)

    from cais.comm import World
    from cais.link import run_sync
    if link is None:
        from cais.params import SwitchParams
        from cais.sim.links.model import ModelLink
        link = ModelLink(SwitchParams(ports=max(4, ranks)))
    store = tdist.HashStore()

    def body(comm):
        world = tdist.distributed_c10d._world
        world.group_count = _NAME_OFFSET * (comm.rank + 1)
        tdist.init_process_group("cais", rank=comm.rank, world_size=ranks, store=store,
                                 pg_options=Options(communicator=comm, check=check))
        try:
            return fn(comm.rank)
        finally:
            tdist.destroy_process_group()

    with _lock:                 # one threaded world at a time in this process
        _install_threaded_pg()
        try:
            kw = {} if config is None else {"config": config}
            return run_sync(World(link, ranks=ranks, rank_ports=rank_ports, **kw).run(body))
        finally:
            _uninstall_threaded_pg()
