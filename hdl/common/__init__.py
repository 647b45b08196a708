"""What every block shares: the AXI4-Stream signature (``axis``), the store-and-forward frame FIFO
(``frame_fifo``), the pipeline helpers (``pipeline``) and the RTL's enumeration shapes (``enums``)."""

__all__ = []
