"""What every block shares: the AXI4-Stream signature (``axis``), the store-and-forward frame FIFO
(``frame_fifo``), the pipeline helpers (``pipeline``), the RTL's enumeration shapes (``enums``) and the block RAM with its
output register (``bram``: the DP16KD's own on ECP5)."""

__all__ = []
