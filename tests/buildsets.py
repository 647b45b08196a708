"""The switch builds the Verilator tests share: one definition, so every test that needs a given kind of
switch reuses one cached build (each parameter set is a Verilog export and a Verilator build of its own,
the suite's largest cost on a fresh clone).

- ``p4_w64``: the default switch (4 x 64 bits, float units), the documents' examples.
- ``p2_w512``: wide beats with float units (16 fp32 lanes a beat: the widest fold chain), for amaranth.sim and the
  latency tables; its Verilog is five times the integer build's (64 float adders), so the Verilator regression
  builds ``p2_w512_jumbo`` instead: wide beats, integer types (floats are covered on the default), and the
  jumbo payloads of :data:`cais.params.JUMBO` (1,024 bytes: 16 rows a set), so one build serves the wide
  regression and tests/sim/test_jumbo.py's RTL checks (the lengths, banks and queues that grow with
  max_payload do not depend on the port count, the beat width or the float units).
- ``p16_int``: the most ports, integer-only (F = ports x 4 + 1, ResultRow without rounding), 64-bit beats (16.2 MB
  of C++ against 26.7 at 128 bits); its float frames are BAD_CODE drops, on the model too (a fold chain of 15
  float stages would double its build). 32 slots: the timing job's sweep check needs more slots than a 60-byte
  frame has beats plus the cycles before it is sent (17 at 64 bits).
"""

from cais.params import JUMBO, SwitchParams

__all__ = ["DEFAULT", "WIDE", "WIDE_JUMBO", "MANY_PORTS", "REGRESSION_SETS", "EXTENDED_BUILDS"]

DEFAULT = SwitchParams()
WIDE = SwitchParams(ports=2, data_width=512, slots=16)
WIDE_JUMBO = SwitchParams(ports=2, data_width=512, float_units=False, **JUMBO)
MANY_PORTS = SwitchParams(ports=16, slots=32, float_units=False)

#: Every build the regression runs, by test id.
REGRESSION_SETS = {"p16_int": MANY_PORTS, "p4_w64": DEFAULT, "p2_w512_jumbo": WIDE_JUMBO}

#: The builds only the extended tier makes (tests/tiers.py; make test-extended and CI, not make test): every test
#: case parametrized with one of them, by name or by value, is marked ``extended``. A test that builds one in its
#: body carries the mark itself.
EXTENDED_BUILDS = {"p16_int": MANY_PORTS, "p2_w512_jumbo": WIDE_JUMBO}
