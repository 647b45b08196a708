"""cocotb testbench of the csr block: test_csr.py."""
