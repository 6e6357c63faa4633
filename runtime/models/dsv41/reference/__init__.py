"""The DeepSeek-V4.1 reference forward over dense weights: the oracle every fast path is checked against."""
