"""The fast DeepSeek-V4.1 forward: kernels on the arena's bytes in place, fixed-shape steps, graphs per key.

Precision, and why:
- EXL3 products (every attention projection, compressor, indexer wk / wq_b, Engram wkv, head) take fp32
  activations; the GEMM kernel rotates them and rounds the rotated rows to fp16 for the matrix units itself
  (a bf16 copy first would only add error), accumulates in fp32 and returns fp32.
- Experts: the MoE kernel takes the fp32 rows (fp16 high / low pairs on its mma decode), fp32 SwiGLU.
- fp32 where the model needs it: the mHC mixes (RMS, Sinkhorn), every norm, the router (bf16 weights read as
  stored through a three-part bf16 split of x, fp32 sums), softmax / attention, the indexer, the logits.
- Cached keys in the model's own quantised rows (kv_rows.py): FP8 window rows, FP4 entries and index keys.
- No weight is decoded, copied or repacked on the GPU path; on a machine without a GPU the kernels' torch
  references stand in (ops_reference.py), decoding groups once (that path is for tests).

Exactness: every step has 16 rows, padding included, so each torch op and EXL3 product has one shape per
key; the MoE runs only the live rows with its launch pinned per table; the indexer's dot products are exact.
A token's bits therefore depend on neither the other rows, nor its slot, nor how its prompt was chunked.
Prompt rows take the prefill forward's wide steps (build.PREFILL_ROWS rows), exact in the same way but not
with the decode steps' bits (another summation order). Modules: weights (arena views), ops / ops_reference (kernels),
kv_rows / kv_layout / kv_pages / kv_memory (KV memory), graph_keys / step_plan (host side), step_context,
attention, compressed, moe, engram, fp32, rope, stages (the small-op stages: their Triton kernels on a GPU), forward (the
step body), runner, build; dense_check (checks only).
"""
