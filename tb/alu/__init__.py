"""cocotb testbench of the alu block: test_alu.py."""
