"""cocotb testbench of the egress block: test_egress.py."""
