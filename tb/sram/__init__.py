"""cocotb testbench of the sram block: test_sram.py."""
