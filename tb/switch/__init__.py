"""cocotb testbench of the switch block: test_switch.py."""
