"""cais.sim.build's cache: a build is reused while its sources are unchanged, and also when they changed
but the inputs they give (the Verilog, the options) are the text the build was made from; any other change
rebuilds."""

from __future__ import annotations

import pytest

from cais.sim import build as b


class Calls:
    """A fake build: counts make() and inputs() calls; inputs() returns the key it is told to."""

    def __init__(self, folder):
        self.folder, self.makes, self.inputs_made, self.content = folder, 0, 0, "text-1"
        self.product = folder / "product"

    def make(self):
        self.makes += 1
        self.product.write_text(f"built from {self.content}")

    def inputs(self):
        self.inputs_made += 1
        return self.content

    def run(self, digest):
        return b._cached_build(self.folder, digest, self.product, self.make, self.inputs)


def test_same_sources_reuse_without_writing_inputs(tmp_path):
    c = Calls(tmp_path)
    assert c.run("sources-1") is False and c.makes == 1
    assert c.run("sources-1") is True and (c.makes, c.inputs_made) == (1, 1)


def test_changed_sources_with_the_same_inputs_are_restamped_not_rebuilt(tmp_path):
    c = Calls(tmp_path)
    c.run("sources-1")
    assert c.run("sources-2") is True and c.makes == 1 and c.inputs_made == 2
    assert c.run("sources-2") is True and c.inputs_made == 2        # restamped: the inputs are not written again
    assert c.product.read_text() == "built from text-1"


def test_changed_inputs_rebuild(tmp_path):
    c = Calls(tmp_path)
    c.run("sources-1")
    c.content = "text-2"
    assert c.run("sources-2") is False and c.makes == 2
    assert c.product.read_text() == "built from text-2"
    c.content = "text-1"                                            # back to the first text: built again
    assert c.run("sources-3") is False and c.makes == 3


def test_a_missing_product_is_rebuilt(tmp_path):
    c = Calls(tmp_path)
    c.run("sources-1")
    c.product.unlink()
    assert c.run("sources-1") is False and c.makes == 2
    c.product.unlink()
    assert c.run("sources-2") is False and c.makes == 3


def test_a_failed_build_leaves_no_stamp(tmp_path):
    c = Calls(tmp_path)
    c.run("sources-1")
    c.content = "text-2"

    def broken():
        raise b.BuildError("the compiler failed")
    with pytest.raises(b.BuildError):
        b._cached_build(tmp_path, "sources-2", c.product, broken, c.inputs)
    assert c.run("sources-2") is False and c.makes == 2              # neither stamp claims the failed build


@pytest.mark.verilator
def test_a_real_build_survives_a_source_edit_that_leaves_its_verilog(tmp_path):
    """build_design on a small counter: a source edit that changes nothing in the Verilog keeps the model
    (its file is not rebuilt); a changed design rebuilds it."""
    from amaranth import Module, Signal
    from amaranth.lib import wiring
    from amaranth.lib.wiring import Out

    from cais.hdl.export import write_verilog

    class Counter(wiring.Component):
        def __init__(self, width):
            self.width = width
            super().__init__({"count": Out(width)})

        def elaborate(self, platform):
            m = Module()
            value = Signal(self.width)
            m.d.sync += value.eq(value + 1)
            m.d.comb += self.count.eq(value)
            return m

    source = tmp_path / "design.txt"               # stands for the sources the key covers
    width = {"bits": 8}

    def build():
        return b.build_design(lambda path, name: write_verilog(Counter(width["bits"]), path, name), "counter",
                              tmp_path / "build", sources=[source], make_vars=b.BLOCK_MAKE_VARS)

    source.write_text("version 1\n")
    first = build()
    assert not first.cached
    mtime = first.executable.stat().st_mtime_ns
    source.write_text("version 1, a comment edited\n")
    again = build()
    assert again.cached and again.key != first.key and again.executable.stat().st_mtime_ns == mtime
    width["bits"] = 9
    source.write_text("version 2\n")
    changed = build()
    assert not changed.cached and changed.executable.stat().st_mtime_ns != mtime


def test_a_failed_training_job_is_a_build_error_naming_its_log(tmp_path):
    """The profile-guided build's training job runs in a process of its own; if it fails (here: no library
    at the path) the build fails with the job's log, not with a model optimised for nothing."""
    from cais.params import SwitchParams

    log = tmp_path / "training.log"
    with pytest.raises(b.BuildError) as e:
        b._train(tmp_path / "missing.so", SwitchParams(ports=2), log)
    assert "training job" in str(e.value) and str(log) in str(e.value)
    # the job itself ran and failed loading the library (the log's first line is only the command)
    assert "OSError" in log.read_text().split("\n", 1)[1]
