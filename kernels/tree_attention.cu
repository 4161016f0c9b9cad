// Tree attention with a bit-packed tree mask, split across the KV sequence (flash-decoding).
//
// Sources: FlashAttention-2 (Dao, 2023: online softmax, warps split the query rows, P kept in registers and
// reused as the A operand of the second matrix product), Flash-Decoding (Dao, Haziza, Massa, Sizov, 2023:
// split the keys across thread blocks, combine the partial (max, sum-exp, acc) with a log-sum-exp
// reduction), SpecInfer (Miao et al., 2024, section 4: tree-based parallel decoding, every tree token's
// query attends the committed prefix plus its ancestors in the token tree).
//
// Organisation (see tree_attention.h for shapes):
//   * Grid (row_tiles, num_splits, B * Hkv). A block owns one KV head of one batch element, one tile of 64
//     query rows and one contiguous range of key tiles. Query rows are the G = Hq / Hkv heads sharing that
//     KV head flattened with the T queries (row r = g * T + t, contiguous in q), so K and V of a KV head are
//     read from device memory once per split, not once per query head (grouped-query attention).
//   * Keys are the L prefix slots followed by the m tree slots, one index space [0, L + m), cut into tiles of
//     64; split s owns tiles [s * tiles_per_split, (s + 1) * tiles_per_split). Prefix keys are never masked;
//     a key j >= L is visible to query t when bit (j - L) of row t of the bit mask is set. Only tiles that
//     reach past L or past the split's end evaluate the mask.
//   * 4 warps, each 16 query rows. Per key tile: S = Q K^T with mma.sync m16n8k16 (fp16/bf16 in, fp32
//     accumulate), online softmax in base 2 on the fp32 accumulators (row max and sum shared by the four
//     lanes of a row with two shuffles), P converted in registers into the A fragment of O += P V.
//     K and V tiles are double-buffered in shared memory with cp.async (16-byte copies, zero fill past the
//     valid rows so no stale or out-of-range memory is read); rows are padded by 16 bytes so ldmatrix is
//     free of bank conflicts.
//   * num_splits == 1: the split kernel writes the normalised output directly. Otherwise each split writes
//     its normalised partial output (fp32) and its log2-sum-exp; a combine kernel (one warp per output row)
//     rescales and sums them. A split, or a whole row, that sees no key at all has lse = -inf and weight 0;
//     a row that sees no key at all gets zeros (as torch's scaled_dot_product_attention does).
//
// This file includes no torch header: it compiles standalone with nvcc.

#include "tree_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

namespace treeopt {
namespace {

constexpr int kThreads = kNumWarps * 32;
constexpr int kPad = 8;  // halves of padding per shared-memory row (16 bytes)

template <int D>
struct SmemLayout {
  static constexpr int kStride = D + kPad;               // halves per row
  static constexpr int kQ = kBlockM * kStride;           // halves
  static constexpr int kKV = kBlockN * kStride;          // halves, one K or V tile
  static constexpr int kTotalHalves = kQ + 4 * kKV;      // Q + 2 stages of (K, V)
  static constexpr int kBytes = kTotalHalves * 2;
};

// ---------------------------------------------------------------------------------------------------------
// PTX helpers (sm_80+: cp.async, ldmatrix, mma.sync m16n8k16)

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy global -> shared; when !valid, writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

template <typename T>
struct Mma;

template <>
struct Mma<__half> {
  // c (16x8 fp32) += a (16x16, row) * b (16x8, col)
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // Two fp32 values -> one register of two 16-bit values, `lo` in the low half (smaller column index).
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// Copy `kRows` rows of D halves (global rows row_begin.., row stride D) into shared memory (row stride
// D + kPad); rows at or past row_limit are zero-filled and their global memory is not read.
template <int D, int kRows, typename T>
__device__ __forceinline__ void load_rows_async(T* dst, const T* src, int row_begin, int row_limit, int tid) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int kStride = D + kPad;
#pragma unroll
  for (int c = tid; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int cc = c % kChunks;
    const int gr = row_begin + r;
    const bool valid = gr < row_limit;
    const T* g = src + static_cast<size_t>(valid ? gr : 0) * D + cc * 8;
    cp_async_16(dst + r * kStride + cc * 8, g, valid);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Split kernel

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    tree_attention_split_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                const uint64_t* __restrict__ mask_bits, T* __restrict__ out,
                                float* __restrict__ o_part, float* __restrict__ lse_part, int B, int Hq, int Hkv,
                                int T_q, int S, int prefix_len, int num_tree_keys, int mask_words,
                                int tiles_per_split, int num_splits, float scale_log2) {
  using L = SmemLayout<D>;
  constexpr int kStride = L::kStride;
  constexpr int kDSteps = D / 16;  // k-steps of Q K^T
  constexpr int kDTiles = D / 8;   // n-tiles of the output
  constexpr int kNTiles = kBlockN / 8;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Layout: Q tile, then stage 0 (K, V), then stage 1 (K, V). Stages are addressed arithmetically, not
  // through a pointer array, which a run-time index would move to local memory.
  T* q_s = reinterpret_cast<T*>(smem_raw);
  auto k_stage = [&](int st) { return q_s + L::kQ + (2 * st) * L::kKV; };
  auto v_stage = [&](int st) { return q_s + L::kQ + (2 * st + 1) * L::kKV; };

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // row within an 8-row group of the mma fragments
  const int t4 = lane % 4; // column pair within the fragments

  const int bh = blockIdx.z;  // b * Hkv + hkv
  const int b = bh / Hkv;
  const int hkv = bh % Hkv;
  const int split = blockIdx.y;
  const int row0 = blockIdx.x * kBlockM;
  const int group = Hq / Hkv;
  const int rows = group * T_q;  // query rows of this KV head

  const int n_keys = prefix_len + num_tree_keys;
  const int n_tiles = (n_keys + kBlockN - 1) / kBlockN;
  const int tile_begin = split * tiles_per_split;
  const int tile_end = min(tile_begin + tiles_per_split, n_tiles);
  const int key_end = min(tile_end * kBlockN, n_keys);

  // Row r of this KV head is query head hkv * group + r / T_q, query r % T_q: contiguous rows of q / out.
  const size_t qo_row_base = (static_cast<size_t>(b) * Hq + static_cast<size_t>(hkv) * group) * T_q;
  const T* q_base = q + qo_row_base * D;
  const size_t kv_off = static_cast<size_t>(bh) * S * D;
  const T* k_base = k + kv_off;
  const T* v_base = v + kv_off;

  // The two rows this lane owns in the fragments (g and g + 8 of its warp's 16) and their mask rows.
  const uint64_t* mask_row[2];
  int row_idx[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_idx[h] = row0 + warp * 16 + g + 8 * h;
    const int tq = row_idx[h] < rows ? row_idx[h] % T_q : 0;  // rows past the end compute junk, never stored
    mask_row[h] = mask_bits + static_cast<size_t>(tq) * mask_words;
  }

  float o_acc[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) o_acc[i][j] = 0.f;
  }
  float row_max[2] = {-INFINITY, -INFINITY};  // running max of the scaled scores (log2 units)
  float row_sum[2] = {0.f, 0.f};              // this lane's part of the running sum of exp2

  if (tile_begin < tile_end) {
    // Prologue: Q tile and the first K/V tile, one commit group.
    load_rows_async<D, kBlockM>(q_s, q_base, row0, rows, tid);
    load_rows_async<D, kBlockN>(k_stage(0), k_base, tile_begin * kBlockN, key_end, tid);
    load_rows_async<D, kBlockN>(v_stage(0), v_base, tile_begin * kBlockN, key_end, tid);
    cp_async_commit();

    uint32_t q_frag[kDSteps][4];

    for (int tile = tile_begin; tile < tile_end; ++tile) {
      const int stage = (tile - tile_begin) & 1;
      if (tile + 1 < tile_end) {
        // Prefetch the next tile into the other stage; the barrier at the end of the previous iteration
        // guarantees every warp is done reading it.
        const int next_key0 = (tile + 1) * kBlockN;
        load_rows_async<D, kBlockN>(k_stage(stage ^ 1), k_base, next_key0, key_end, tid);
        load_rows_async<D, kBlockN>(v_stage(stage ^ 1), v_base, next_key0, key_end, tid);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();

      if (tile == tile_begin) {
        // A fragments of this warp's 16 query rows, kept in registers for the whole key range.
#pragma unroll
        for (int kk = 0; kk < kDSteps; ++kk) {
          const int r = warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
          const int c = kk * 16 + 8 * (lane / 16);
          ldmatrix_x4(q_frag[kk], q_s + r * kStride + c);
        }
      }

      // S = Q K^T for 16 rows x 64 keys per warp.
      float s[kNTiles][4];
#pragma unroll
      for (int i = 0; i < kNTiles; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] = 0.f;
      }
      const T* ks = k_stage(stage);
#pragma unroll
      for (int kk = 0; kk < kDSteps; ++kk) {
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
          uint32_t kb[4];
          const int mi = lane / 8;
          const int r = np * 16 + (lane % 8) + 8 * (mi / 2);
          const int c = kk * 16 + 8 * (mi % 2);
          ldmatrix_x4(kb, ks + r * kStride + c);
          Mma<T>::run(s[2 * np], q_frag[kk], kb[0], kb[1]);
          Mma<T>::run(s[2 * np + 1], q_frag[kk], kb[2], kb[3]);
        }
      }

      // Scale into log2 units; mask tree keys and keys past this split's end.
      const int key0 = tile * kBlockN;
      const bool needs_mask = (key0 + kBlockN > prefix_len) || (key0 + kBlockN > key_end);
      if (needs_mask) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int key = key0 + nt * 8 + 2 * t4 + (j & 1);
            bool visible = key < key_end;
            if (visible && key >= prefix_len) {
              const int rel = key - prefix_len;
              const uint64_t word = __ldg(reinterpret_cast<const unsigned long long*>(mask_row[j / 2]) + (rel >> 6));
              visible = (word >> (rel & 63)) & 1ull;
            }
            s[nt][j] = visible ? s[nt][j] * scale_log2 : -INFINITY;
          }
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int j = 0; j < 4; ++j) s[nt][j] *= scale_log2;
        }
      }

      // Online softmax (FlashAttention-2): new max, rescale the accumulator, exponentiate.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float new_max = fmaxf(row_max[h], mx);
        // A row that has seen no visible key yet keeps max -inf; subtract 0 then, so exp2(-inf) = 0, no NaN.
        const float m_use = new_max == -INFINITY ? 0.f : new_max;
        const float alpha = exp2f(row_max[h] - m_use);
        row_max[h] = new_max;
        float psum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          s[nt][2 * h] = exp2f(s[nt][2 * h] - m_use);
          s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] - m_use);
          psum += s[nt][2 * h] + s[nt][2 * h + 1];
        }
        row_sum[h] = row_sum[h] * alpha + psum;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o_acc[dt][2 * h] *= alpha;
          o_acc[dt][2 * h + 1] *= alpha;
        }
      }

      // O += P V. The accumulator layout of two adjacent 8-key n-tiles is the A layout of one 16-key k-step.
      const T* vs = v_stage(stage);
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t pa[4];
        pa[0] = Mma<T>::pack(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = Mma<T>::pack(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = Mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = Mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          uint32_t vb[4];
          const int mi = lane / 8;
          const int r = kk * 16 + (lane % 8) + 8 * (mi % 2);
          const int c = dp * 16 + 8 * (mi / 2);
          ldmatrix_x4_trans(vb, vs + r * kStride + c);
          Mma<T>::run(o_acc[2 * dp], pa, vb[0], vb[1]);
          Mma<T>::run(o_acc[2 * dp + 1], pa, vb[2], vb[3]);
        }
      }
      __syncthreads();  // every warp done with this stage before it is refilled
    }
  }

  // Epilogue: full row sums, then either the final output or this split's partial result.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = row_idx[h];
    if (r >= rows) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (num_splits == 1) {
      T* out_row = out + (qo_row_base + r) * D;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        *reinterpret_cast<uint32_t*>(out_row + dt * 8 + 2 * t4) =
            Mma<T>::pack(o_acc[dt][2 * h] * inv, o_acc[dt][2 * h + 1] * inv);
      }
    } else {
      const size_t rows_total = static_cast<size_t>(B) * Hq * T_q;
      const size_t prow = static_cast<size_t>(split) * rows_total + qo_row_base + r;
      float* o_row = o_part + prow * D;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        *reinterpret_cast<float2*>(o_row + dt * 8 + 2 * t4) =
            make_float2(o_acc[dt][2 * h] * inv, o_acc[dt][2 * h + 1] * inv);
      }
      if (t4 == 0) lse_part[prow] = l > 0.f ? row_max[h] + log2f(l) : -INFINITY;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Combine kernel: one warp per output row (b, h, t), D / 32 contiguous elements per lane.

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

constexpr int kCombineWarps = 4;

template <typename T, int D>
__global__ void __launch_bounds__(kCombineWarps * 32)
    tree_attention_combine_kernel(const float* __restrict__ o_part, const float* __restrict__ lse_part,
                                  T* __restrict__ out, int rows_total, int num_splits) {
  constexpr int kPer = D / 32;
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kCombineWarps + threadIdx.x / 32;
  if (row >= rows_total) return;

  float gmax = -INFINITY;
  for (int s = lane; s < num_splits; s += 32) gmax = fmaxf(gmax, lse_part[static_cast<size_t>(s) * rows_total + row]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) gmax = fmaxf(gmax, __shfl_xor_sync(0xffffffffu, gmax, off));

  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.f;
  float wsum = 0.f;
  if (gmax != -INFINITY) {
    for (int s = 0; s < num_splits; ++s) {
      const size_t prow = static_cast<size_t>(s) * rows_total + row;
      const float w = exp2f(lse_part[prow] - gmax);
      if (w > 0.f) {
        wsum += w;
        const float* src = o_part + prow * D + lane * kPer;
#pragma unroll
        for (int i = 0; i < kPer; ++i) acc[i] += w * src[i];
      }
    }
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  T* dst = out + static_cast<size_t>(row) * D + lane * kPer;
#pragma unroll
  for (int i = 0; i < kPer; ++i) dst[i] = from_float<T>(acc[i] * inv);
}

// ---------------------------------------------------------------------------------------------------------
// Host side

template <typename T, int D>
cudaError_t launch_typed(const TreeAttnParams& p, cudaStream_t stream) {
  constexpr int kSmem = SmemLayout<D>::kBytes;
  auto* kernel = tree_attention_split_kernel<T, D>;
  // Raise the dynamic shared-memory limit above the 48 KB default once per device.
  static bool configured[64] = {false};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= 64 || !configured[dev]) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
    if (dev >= 0 && dev < 64) configured[dev] = true;
  }
  const int group = p.Hq / p.Hkv;
  const int rows = group * p.T;
  dim3 grid((rows + kBlockM - 1) / kBlockM, p.num_splits, p.B * p.Hkv);
  const float scale_log2 = p.scale * 1.4426950408889634f;  // exp(x) = exp2(x * log2(e))
  kernel<<<grid, kThreads, kSmem, stream>>>(
      static_cast<const T*>(p.q), static_cast<const T*>(p.k), static_cast<const T*>(p.v), p.mask_bits,
      static_cast<T*>(p.out), p.o_part, p.lse_part, p.B, p.Hq, p.Hkv, p.T, p.S, p.prefix_len, p.num_tree_keys,
      p.mask_words, p.tiles_per_split, p.num_splits, scale_log2);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.num_splits == 1) return err;

  const int rows_total = p.B * p.Hq * p.T;
  dim3 cgrid((rows_total + kCombineWarps - 1) / kCombineWarps);
  tree_attention_combine_kernel<T, D><<<cgrid, kCombineWarps * 32, 0, stream>>>(
      p.o_part, p.lse_part, static_cast<T*>(p.out), rows_total, p.num_splits);
  return cudaGetLastError();
}

}  // namespace

int tree_attention_smem_bytes(int D) {
  if (D == 64) return SmemLayout<64>::kBytes;
  if (D == 128) return SmemLayout<128>::kBytes;
  return -1;
}

cudaError_t tree_attention_launch(const TreeAttnParams& p, cudaStream_t stream) {
  if (!p.q || !p.k || !p.v || !p.mask_bits || !p.out) return cudaErrorInvalidValue;
  if (p.B < 1 || p.Hq < 1 || p.Hkv < 1 || p.T < 1 || p.Hq % p.Hkv != 0) return cudaErrorInvalidValue;
  if (p.prefix_len < 0 || p.num_tree_keys < 0 || p.prefix_len + p.num_tree_keys > p.S) return cudaErrorInvalidValue;
  if (p.prefix_len + p.num_tree_keys < 1) return cudaErrorInvalidValue;
  if (p.mask_words * 64 < p.num_tree_keys) return cudaErrorInvalidValue;
  if (p.num_splits < 1 || p.tiles_per_split < 1 || p.num_splits > 65535 || p.B * p.Hkv > 65535)
    return cudaErrorInvalidValue;
  const int n_tiles = (p.prefix_len + p.num_tree_keys + kBlockN - 1) / kBlockN;
  if (static_cast<long long>(p.num_splits) * p.tiles_per_split < n_tiles) return cudaErrorInvalidValue;
  if (p.num_splits > 1 && (!p.o_part || !p.lse_part)) return cudaErrorInvalidValue;
  switch (p.dtype) {
    case DType::kFloat16:
      if (p.D == 64) return launch_typed<__half, 64>(p, stream);
      if (p.D == 128) return launch_typed<__half, 128>(p, stream);
      break;
    case DType::kBFloat16:
      if (p.D == 64) return launch_typed<__nv_bfloat16, 64>(p, stream);
      if (p.D == 128) return launch_typed<__nv_bfloat16, 128>(p, stream);
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace treeopt
