// Tree attention for speculative decoding: plain C++ interface of the CUDA kernels in tree_attention.cu.
//
// This header has no torch dependency, so tree_attention.cu compiles standalone with nvcc (the CPU test
// tests/test_kernel_compile.py does exactly that for sm_80 and sm_90); the torch binding lives in
// tree_attention_binding.cpp.
//
// Shapes (all tensors contiguous, row-major):
//   q         (B, Hq, T, D)          fp16 or bf16     queries of the T new tokens
//   k, v      (B, Hkv, S, D)         same dtype       static KV cache; slots [0, L) are the committed prefix,
//                                                     slots [L, L + m) the tree tokens
//   mask_bits (T, W) uint64, W = ceil(m / 64)         bit (j % 64) of word (j / 64) of row i: query i sees
//                                                     tree slot j (slot L + j of the cache)
//   out       (B, Hq, T, D)          dtype of q
//   o_part    (num_splits, B, Hq, T, D) fp32          per-split normalised partial outputs (num_splits > 1)
//   lse_part  (num_splits, B, Hq, T)    fp32          per-split log2-sum-exp2 of the scaled scores
// Query head h reads KV head h / (Hq / Hkv) (grouped-query attention).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace treeopt {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1 };

// Tile sizes shared by the kernel and the host-side split planner (sequoia_opt/attention/cuda.py mirrors
// them: BLOCK_M, BLOCK_N).
constexpr int kBlockM = 64;   // query rows (group * T flattened) per thread block, 16 per warp
constexpr int kBlockN = 64;   // keys per tile of the main loop
constexpr int kNumWarps = 4;  // 128 threads per block

struct TreeAttnParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const uint64_t* mask_bits = nullptr;
  void* out = nullptr;
  float* o_part = nullptr;    // may be null when num_splits == 1
  float* lse_part = nullptr;  // may be null when num_splits == 1
  int B = 0, Hq = 0, Hkv = 0, T = 0, S = 0, D = 0;
  int prefix_len = 0;       // L
  int num_tree_keys = 0;    // m
  int mask_words = 0;       // W
  int tiles_per_split = 0;  // key tiles of kBlockN per split
  int num_splits = 0;
  float scale = 0.f;        // softmax scale (natural-exponent units, e.g. 1/sqrt(D))
  DType dtype = DType::kFloat16;
};

// Checks the parameters and enqueues the split kernel (and the combine kernel when num_splits > 1) on
// `stream`. Returns cudaErrorInvalidValue for unsupported parameters, else the launch error, if any.
cudaError_t tree_attention_launch(const TreeAttnParams& p, cudaStream_t stream);

// Dynamic shared memory one block of the split kernel needs for head_dim D (bytes).
int tree_attention_smem_bytes(int D);

}  // namespace treeopt
