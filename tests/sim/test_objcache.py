"""cais.sim.objcache: which compiles it caches, and a cached object equal to a fresh compile."""

from cais.sim.objcache import cache_key, cached_source, compile_cached


def test_only_runtime_sources_of_an_include_folder_are_cached(tmp_path):
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "verilated.cpp").write_text("int x;\n")
    (tmp_path / "Vtop__ALL.cpp").write_text("int y;\n")
    runtime = str(inc / "verilated.cpp")
    assert cached_source(["-O0", "-c", "-o", "verilated.o", runtime]) == inc / "verilated.cpp"
    assert cached_source(["-O0", "-c", runtime]) is None                           # no explicit object
    assert cached_source(["-O0", "-o", "verilated", runtime]) is None              # a link, not a compile
    assert cached_source(["-c", "-o", "a.o", str(tmp_path / "Vtop__ALL.cpp")]) is None     # the model
    assert cached_source(["-c", "-o", "v.o", "verilator.cpp"]) is None             # relative: cocotb's main


def test_second_compile_is_copied_and_a_define_makes_another_entry(tmp_path, monkeypatch):
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "verilated_x.h").write_text("#define FORTY_TWO 42\n")
    src = inc / "verilated_x.cpp"
    src.write_text('#include "verilated_x.h"\nint answer() { return FORTY_TWO + EXTRA; }\n')
    cache = tmp_path / "cache"
    builds = [tmp_path / "b1", tmp_path / "b2", tmp_path / "b3"]
    for b in builds:
        b.mkdir()
    args = ["-O0", "-MMD", "-DEXTRA=1", "-c", "-o", "verilated_x.o", str(src)]

    monkeypatch.chdir(builds[0])
    assert compile_cached("c++", args, cache) == 0
    first = (builds[0] / "verilated_x.o").read_bytes()
    assert (builds[0] / "verilated_x.d").is_file()
    entries = [p for p in cache.rglob("obj")]
    assert len(entries) == 1

    # The same command in another build gets the stored object (marked here, so a compile would show).
    (entries[0]).write_bytes(b"stored")
    monkeypatch.chdir(builds[1])
    assert compile_cached("c++", args, cache) == 0
    assert (builds[1] / "verilated_x.o").read_bytes() == b"stored"
    assert (builds[1] / "verilated_x.d").read_text() == (builds[0] / "verilated_x.d").read_text()
    assert first[:4] == b"\x7fELF"
    # Another compiler is another key: it runs (and fails here).
    assert compile_cached("false", args, cache) != 0

    # Another define, or a changed header: another key.
    other = [a if a != "-DEXTRA=1" else "-DEXTRA=2" for a in args]
    assert cache_key("c++", other, src) != cache_key("c++", args, src)
    before = cache_key("c++", args, src)
    (inc / "verilated_x.h").write_text("#define FORTY_TWO 43  \n")
    assert cache_key("c++", args, src) != before
    monkeypatch.chdir(builds[2])
    assert compile_cached("c++", other, cache) == 0
    assert len([p for p in cache.rglob("obj")]) == 2
