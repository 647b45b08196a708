"""CAIS: the software side of the switch (protocol, register map, driver, controller).

The torch-style API of a deployed rank (one process per rank over raw Ethernet, :mod:`cais.dist`) is
re-exported here: ``cais.init()``, ``cais.all_reduce(array, op=cais.ReduceOp.SUM)``, ``cais.broadcast``,
``cais.all_gather``, ``cais.reduce_scatter``, ``cais.barrier``, ``cais.reduce``, ``cais.gather``,
``cais.scatter``, ``cais.all_to_all``, ``cais.send``/``cais.recv``, ``cais.new_group``, ``cais.synchronize``,
... (docs/driver.md). It is imported on first use, so ``import cais.protocol`` stays light.
"""

_DIST = ("init", "init_process_group", "is_initialized", "destroy_process_group", "new_group", "get_rank",
         "get_world_size", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "synchronize",
         "reduce", "gather", "scatter", "all_to_all", "send", "recv", "ReduceOp", "Work", "ProcessGroup",
         "CollectiveError")

__all__ = list(_DIST)


def __getattr__(name):
    if name in _DIST:
        from . import dist
        return getattr(dist, name)
    raise AttributeError(f"module 'cais' has no attribute {name!r}")
