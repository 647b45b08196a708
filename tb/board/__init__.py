"""The board top under cocotb + Verilator (make board-sim, docs/board.md)."""
