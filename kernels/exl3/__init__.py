"""The model-neutral EXL3 library: codebooks, decode, GEMV / GEMM, MoE over expert tables, beside their references."""
