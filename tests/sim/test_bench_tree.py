"""bench/bench_tree.py: the command line, and the extra latency of a tree level measured on the fabric
equals the one derived from the documented latencies and the frames' beats."""

from benchscripts import assert_refused, load_script

bench = load_script("bench_tree")


def test_bad_rank_counts_are_refused(capsys):
    assert_refused(bench.parse_args, ["--ranks", "7"], "--ranks 7: must be a multiple of --leaves 2", capsys)
    assert_refused(bench.parse_args, ["--ranks", "18"], "--ranks 18", capsys)


def test_a_small_run_is_correct_and_its_latency_is_the_derived_one(capsys):
    assert bench.main(["--ranks", "4", "--elements", "256", "--json"]) == 0
    import json
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert all(row["correct"].values())
    assert row["latency_measured"] == row["latency_derived"]
    assert row["latency_measured"]["extra"] > 0
