"""make bitstream (cais.hdl.board.build): the report parser and timing check on a nextpnr report written by
hand, the CLI's refusal of bad arguments, the PLL's arithmetic. The full build (13-20 minutes) is
`make bitstream`'s, not the suite's: alone it would take make test past its ten minutes."""

import json

import pytest

from cais.hdl.board import build as board_build
from cais.hdl.board.versa import PLL, VERSA_CONFIG, pll_frequencies

# A nextpnr-ecp5 --report file as nextpnr writes it, numbers made up: the switch clock and both receive clocks
# met, the transmit clock missed.
CANNED = {
    "utilization": {
        "TRELLIS_COMB": {"used": 30000, "available": 43848},
        "TRELLIS_FF": {"used": 20000, "available": 43848},
        "DP16KD": {"used": 54, "available": 108},
        "EHXPLLL": {"used": 1, "available": 4},
        "TRELLIS_IO": {"used": 40, "available": 203},
    },
    "fmax": {
        "$glbnet$clk": {"achieved": 70.25, "constraint": 62.5},
        "$glbnet$core.mac_rx0.rx0_clk": {"achieved": 180.0, "constraint": 125.0},
        "$glbnet$core.mac_rx1.rx1_clk": {"achieved": 175.5, "constraint": 125.0},
        "$glbnet$core.mac_tx0.tx_clk": {"achieved": 119.9, "constraint": 125.0},
        "$glbnet$core.phy0.tx90_clk": {"achieved": 448.2, "constraint": 125.0},
    },
    "critical_paths": [
        {"from": "posedge $glbnet$clk", "to": "posedge $glbnet$clk", "path": [
            {"type": "clk-to-q", "from": {"cell": "core.switch.a_TRELLIS_FF_Q", "port": "CLK"},
             "to": {"cell": "core.switch.a_TRELLIS_FF_Q", "port": "Q"}, "delay": 0.5},
            {"type": "routing", "from": {"cell": "core.switch.a_TRELLIS_FF_Q", "port": "Q"},
             "to": {"cell": "core.switch.b_TRELLIS_FF_Q", "port": "DI"}, "delay": 13.2}]},
        {"from": "posedge $glbnet$core.mac_tx0.tx_clk", "to": "posedge $glbnet$core.mac_tx0.tx_clk", "path": [
            {"type": "clk-to-q", "from": {"cell": "core.mac_tx0.crc_TRELLIS_FF_Q", "port": "CLK"},
             "to": {"cell": "core.mac_tx0.crc_TRELLIS_FF_Q", "port": "Q"}, "delay": 0.52},
            {"type": "logic", "from": {"cell": "core.mac_tx0.crc_TRELLIS_FF_Q", "port": "Q"},
             "to": {"cell": "core.mac_tx0.lut", "port": "Z"}, "delay": 3.0},
            {"type": "routing", "from": {"cell": "core.mac_tx0.lut", "port": "Z"},
             "to": {"cell": "core.mac_tx0.crc_TRELLIS_FF_Q_7", "port": "DI"}, "delay": 4.82}]},
    ],
}


def test_report_parser_on_a_canned_report():
    parsed = board_build.parse_report(json.loads(json.dumps(CANNED)))
    assert parsed["resources"] == {"LUT4": (30000, 43848), "FF": (20000, 43848), "DP16KD (block RAM)": (54, 108),
                                   "EHXPLLL": (1, 4)}
    by_net = {c["net"]: c for c in parsed["clocks"]}
    assert by_net["clk"]["role"] == "switch (sync)" and by_net["clk"]["met"]
    assert by_net["core.mac_rx0.rx0_clk"]["role"] == "RGMII receive, port 0 (rx0)"
    assert by_net["core.phy0.tx90_clk"]["role"] == "RGMII TXC (tx90)"
    assert by_net["core.mac_rx1.rx1_clk"]["met"] and not by_net["core.mac_tx0.tx_clk"]["met"]
    assert by_net["core.mac_tx0.tx_clk"]["role"] == "RGMII transmit (tx)"
    failures = board_build.timing_failures(parsed)
    assert failures == ["clock core.mac_tx0.tx_clk (RGMII transmit (tx)) reached 119.9 MHz, constraint 125.0 MHz; critical path "
                        "core.mac_tx0.crc_TRELLIS_FF_Q -> core.mac_tx0.crc_TRELLIS_FF_Q_7, 8.34 ns in 3 steps"]
    text = board_build.format_report(parsed, ["header"])
    assert "LUT4" in text and "68.4%" in text and "NO" in text


def test_all_clocks_met_means_no_failures():
    met = json.loads(json.dumps(CANNED))
    met["fmax"]["$glbnet$core.mac_tx0.tx_clk"]["achieved"] = 130.0
    assert board_build.timing_failures(board_build.parse_report(met)) == []


@pytest.mark.parametrize("argv, words", [
    (["--board", "arty"], "invalid choice: 'arty'"),
    (["--seed", "zero"], "'zero' is not an integer"),
    (["--slots", "0"], "must be at least 1"),
])
def test_cli_refuses_bad_args_in_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        board_build.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_pll_settings():
    f = pll_frequencies()
    assert 400e6 <= f["vco"] <= 800e6 and 3.125e6 <= f["pfd"]          # EHXPLLL's VCO and PFD ranges
    assert (f["sync"], f["tx"], f["tx90"], f["tx90_phase"]) == (62.5e6, 125e6, 125e6, 90.0)
    assert VERSA_CONFIG.clk_freq == 62_500_000 and PLL["CLKOS2_SHIFT"] == 1
    # the switch outruns both ports: 8 bytes a cycle against Gigabit Ethernet's 125 MB/s
    assert VERSA_CONFIG.params.beat_bytes * f["sync"] >= 4 * 125e6
