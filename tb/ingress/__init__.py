"""cocotb testbench of the ingress block: test_ingress.py."""
