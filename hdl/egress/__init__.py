"""Result generation and egress: the result generator (``results``: :class:`ResultGenerator`, folded rows
into CAIS result frames) and the egress stage (``ports``: the crossbar, the result fanout, each port's
egress FIFO, result queue and merge)."""

__all__ = []
