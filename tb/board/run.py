"""``make board-sim``: the board top under Verilator + cocotb (the host side: build, run, report).

    python -m cais.tb.board.run [--short] [--elements N] [--dtype int32] [--test NAME] [--waves]

What is simulated: :class:`cais.hdl.board.simtop.BoardSimTop`, the board's logic exactly as the bitstream
has it (switch with the Versa's parameters, UART bridge, MACs, crossing FIFOs, RGMII DDR capture and launch,
reset sequencing) with the PLL replaced by clock inputs, the RGMII pins' I/O cells by their behaviour, the
PHY reset shortened and the UART at 15.6 Mbaud instead of 115200 (the bridge's logic is the same, its
divisor 4 instead of 543). The tests are :mod:`cais.tb.board.test_board`.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

__all__ = ["sim_config", "build_board", "run_board", "JOB_ENV", "TESTS", "main"]

#: Environment variable carrying the job (JSON) to the cocotb tests.
JOB_ENV = "CAIS_BOARD_JOB"
#: The cocotb tests of :mod:`cais.tb.board.test_board`.
TESTS = ("board_all_reduce", "board_bad_frames", "board_uart_edges", "board_controller_over_uart")
TOP = "cais_board"


def sim_config():
    """The simulated board's :class:`~cais.hdl.board.core.BoardConfig`: the Versa's switch and clock, a
    faster UART, a short PHY reset and short LED timers."""
    from cais.hdl.board.versa import VERSA_CONFIG

    from .link import UART_BAUD
    return replace(VERSA_CONFIG, baud=UART_BAUD, phy_reset_cycles=4, activity_bits=4, heartbeat_bits=8)


def build_board(waves: bool = False):
    """Build (or reuse: cached on the sources and the config) the Verilator model of the simulated board."""
    from cais.hdl.board.simtop import BoardSimTop
    from cais.hdl.export import write_verilog
    from cais.sim.build import BLOCK_MAKE_VARS, build_design, build_root

    config = sim_config()
    folder = build_root() / "sim" / f"board_{config.params.slug()}{'_waves' if waves else ''}"
    key = {"board": "sim", "params": config.params.as_dict(), "clk_freq": config.clk_freq, "baud": config.baud,
           "phy_reset_cycles": config.phy_reset_cycles}
    return build_design(lambda path, name: write_verilog(BoardSimTop(config), path, name), TOP, folder,
                        key=key, waves=waves, params=config.params, make_vars=BLOCK_MAKE_VARS)


def run_board(tests=TESTS, *, elements: int = 256, dtype: str = "int32", seed: int = 1, waves: bool = False) -> dict:
    """Run the board's cocotb tests; returns the all-reduce's summary (empty when it did not run).
    Raises AssertionError naming the failing tests."""
    from cais.sim.build import run_test

    build = build_board(waves)
    with tempfile.TemporaryDirectory(prefix="cais-board-") as tmp:
        result = Path(tmp) / "result.json"
        env = {JOB_ENV: json.dumps({"elements": elements, "dtype": dtype, "seed": seed}),
               "CAIS_BOARD_RESULT": str(result)}
        run_test(build, "cais.tb.board.test_board", ",".join(tests), extra_env=env)
        return json.loads(result.read_text()) if result.is_file() else {}


def main(argv=None) -> int:
    from cais.cmdline import Parser, integer

    parser = Parser(prog="make board-sim", description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="a 64-element all-reduce (make test's length)")
    parser.add_argument("--elements", type=integer(1), default=1024, help="elements per rank (default 1024)")
    parser.add_argument("--dtype", choices=["int32", "int16", "int8", "float32", "float16", "bfloat16"],
                        default="int32")
    parser.add_argument("--test", choices=TESTS, action="append", help="run only this test (repeatable)")
    parser.add_argument("--seed", type=integer(0), default=1)
    parser.add_argument("--waves", action="store_true", help="VCD of the run (build/sim/board_*_waves/runs/)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    try:
        summary = run_board(tuple(args.test or TESTS), elements=64 if args.short else args.elements,
                            dtype=args.dtype, seed=args.seed, waves=args.waves)
    except AssertionError as exc:
        print(f"make board-sim: FAILED: {exc}", file=sys.stderr)
        return 1
    if summary:
        print(f"board-sim: all-reduce of {summary['elements']} {summary['dtype']} x 2 ranks over RGMII: "
              f"{'CORRECT' if summary['correct'] else 'WRONG'} ({summary['cycles']} switch cycles, "
              f"{summary['frames_sent']} frames sent)")
    print(f"board-sim: {', '.join(args.test or TESTS)} passed ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
