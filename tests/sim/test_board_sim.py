"""make board-sim's short version: the whole board top (cais.hdl.board.simtop) under Verilator + cocotb, two
hosts on its RGMII pins and the controller's register accesses on its UART pins (cais.tb.board.test_board):
a 64-element int32 all-reduce CORRECT against numpy; a wrong FCS, a runt and a frame cut short counted as
BAD_FCS, a giant as OVERSIZE, the good frames between them at the minimum gap flooded whole; a bad check
byte and an unmapped register answered as documented. One Verilator build of the board (cached)."""

import pytest

from cais.tb.board.run import TESTS, run_board

pytestmark = [pytest.mark.verilator, pytest.mark.slow]


def test_board_sim_short():
    summary = run_board(TESTS, elements=64)
    assert summary["correct"] and summary["ranks"] == 2 and summary["elements"] == 64
