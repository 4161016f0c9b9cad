// Torch binding of the tree-attention kernels (tree_attention.cu). Thin on purpose: it checks tensors,
// fills TreeAttnParams and launches on torch's current stream. Shapes, split planning and buffer allocation
// are decided in sequoia_opt/attention/cuda.py, which documents them.
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "tree_attention.h"

namespace {

void check_cuda_contiguous(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name, " must be 16-byte aligned");
}

// q (B, Hq, T, D); k, v (B, Hkv, S, D); mask_bits (T, W) int64; out (B, Hq, T, D);
// o_part (num_splits, B, Hq, T, D) fp32 and lse_part (num_splits, B, Hq, T) fp32 (ignored when num_splits == 1).
void tree_attention_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& mask_bits, torch::Tensor& out, torch::Tensor& o_part,
                            torch::Tensor& lse_part, int64_t prefix_len, int64_t num_tree_keys,
                            int64_t tiles_per_split, int64_t num_splits, double scale) {
  check_cuda_contiguous(q, "q");
  check_cuda_contiguous(k, "k_cache");
  check_cuda_contiguous(v, "v_cache");
  check_cuda_contiguous(out, "out");
  TORCH_CHECK(mask_bits.is_cuda() && mask_bits.is_contiguous(), "mask bits must be a contiguous CUDA tensor");
  TORCH_CHECK(mask_bits.scalar_type() == torch::kInt64 && mask_bits.dim() == 2, "mask bits must be (T, W) int64");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && out.dim() == 4, "q, k, v, out must be 4-D");
  TORCH_CHECK(k.sizes() == v.sizes(), "k_cache and v_cache shapes differ");
  TORCH_CHECK(out.sizes() == q.sizes(), "out must have the shape of q");
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat16 || dtype == torch::kBFloat16, "q must be float16 or bfloat16");
  TORCH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype && out.scalar_type() == dtype,
              "q, k_cache, v_cache and out must share one dtype");
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device() && out.device() == q.device() &&
                  mask_bits.device() == q.device(),
              "all tensors must be on one device");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3), "q and the cache disagree on batch or head_dim");
  TORCH_CHECK(mask_bits.size(0) == q.size(2), "mask bits need one row per query");
  if (num_splits > 1) {
    check_cuda_contiguous(o_part, "o_part");
    check_cuda_contiguous(lse_part, "lse_part");
    TORCH_CHECK(o_part.scalar_type() == torch::kFloat32 && lse_part.scalar_type() == torch::kFloat32,
                "partial buffers must be float32");
    TORCH_CHECK(o_part.numel() == num_splits * q.numel() && lse_part.numel() == num_splits * q.numel() / q.size(3),
                "partial buffers have the wrong size");
  }

  treeopt::TreeAttnParams p;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.mask_bits = reinterpret_cast<const uint64_t*>(mask_bits.data_ptr<int64_t>());
  p.out = out.data_ptr();
  p.o_part = num_splits > 1 ? o_part.data_ptr<float>() : nullptr;
  p.lse_part = num_splits > 1 ? lse_part.data_ptr<float>() : nullptr;
  p.B = static_cast<int>(q.size(0));
  p.Hq = static_cast<int>(q.size(1));
  p.T = static_cast<int>(q.size(2));
  p.D = static_cast<int>(q.size(3));
  p.Hkv = static_cast<int>(k.size(1));
  p.S = static_cast<int>(k.size(2));
  p.prefix_len = static_cast<int>(prefix_len);
  p.num_tree_keys = static_cast<int>(num_tree_keys);
  p.mask_words = static_cast<int>(mask_bits.size(1));
  p.tiles_per_split = static_cast<int>(tiles_per_split);
  p.num_splits = static_cast<int>(num_splits);
  p.scale = static_cast<float>(scale);
  p.dtype = dtype == torch::kFloat16 ? treeopt::DType::kFloat16 : treeopt::DType::kBFloat16;

  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err = treeopt::tree_attention_launch(p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "tree_attention kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "treeopt tree attention (bit-packed tree mask, split-K over the KV cache)";
  m.def("forward", &tree_attention_forward, "tree attention forward (see sequoia_opt/attention/cuda.py)");
  m.def("smem_bytes", &treeopt::tree_attention_smem_bytes, "dynamic shared memory per block for head_dim D");
}
