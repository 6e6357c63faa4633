"""DeepSeek-V4.1's stage kernels (Triton): attention, KV packing, the indexer, the router, mHC, Engram rows."""
