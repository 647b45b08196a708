"""The header parser: per-port ingress checks and header extraction (``ingress``: :class:`IngressPort`,
its frame FIFO and header queue) over the wire layout of the Ethernet and CAIS headers (``header``:
:class:`FrameHeader`)."""

__all__ = []
