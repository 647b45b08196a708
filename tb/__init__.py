"""cocotb testbenches, one folder per block (tb/<block>/test_<block>.py); tb/common.py holds what they share, tb/run.py runs them."""
