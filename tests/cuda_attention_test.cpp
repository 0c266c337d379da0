// The CUDA attention path against the CPU ops on the same data. A KV pool and sequence state are built
// on the CPU with random K/V (positions past the last token hold NaN, so a kernel that reads them fails),
// their slots are mirrored to device memory in a permuted order behind a device slot array, and
// attention_paged is compared with the CPU attention op: F32, F16, Q8_0 and Q4_0 KV, head_dim 32..512,
// GQA ratios 1/4/6/8, 1..300 query tokens, positions 0..5000, chunks of 16 and 64, max_kv bounds far
// above the need (empty splits). Also: both kernels on the same data, the public attention op on F16,
// Q8_0 and Q4_0 chunks, kv_append (bit-exact against a CPU copy; Q8_0 and Q4_0 against
// quant::quantize_row), rope_neox_at, attention_prep (bit-exact against the chain of norms, rotations and
// append it fuses), attention_paged_gated_q8 (bit-exact against attention, output gate and quantizer),
// attention_decode_q8 (bit-exact against attention_prep then attention_paged_gated_q8, also replayed as
// a graph), get_rows_trusted, and one decode step captured as a CUDA graph and replayed at several
// positions. Outputs start as NaN. Skipped without a CUDA build or device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <tuple>
#include <vector>

#include "core/half.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"
#include "quant/quant.h"

#if DS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/cuda/attention_launch.h"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/matvec_launch.h"
#include "ops/cuda/pdl.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/get_rows.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "state/kv_pool.h"
#include "state/sequence_state.h"
#endif

namespace ds {
namespace {

#if DS_HAVE_CUDA

using test::Host;

// Tolerances on max |cuda - cpu| relative to max |cpu| over the whole output (stated once):
//  - F32 arithmetic paths (SIMT kernel, F32 or F16 KV): both sides sum in F32 in different orders.
//  - tensor-core path: q and the softmax weights are rounded to F16 (2^-12 relative each); with Q8_0 or
//    Q4_0 KV the dequantized K and V too (the CPU uses them in F32).
constexpr double kTolF32Path = 1e-5;
constexpr double kTolTensorCore = 2e-3;

bool kv_blocks(DType t) { return t == DType::Q8_0 || t == DType::Q4_0; }
bool tc_shape(DType t, int64_t D) {
  if (kv_blocks(t)) return D == 64 || D == 128 || D == 256;
  return t == DType::F16 && (D == 32 || D == 64 || D == 128 || D == 256);
}
double tol_for(DType t, int64_t D) { return tc_shape(t, D) ? kTolTensorCore : kTolF32Path; }

// Max error relative to max |ref|; reports the first element over the bound as [token, head, dim].
::testing::AssertionResult close_rel(const std::vector<float>& got, const std::vector<float>& ref, double tol,
                                     int64_t D, int64_t H) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << ref.size();
  double mx = 0.0, err = 0.0;
  for (float r : ref) mx = std::max(mx, static_cast<double>(std::fabs(r)));
  if (mx == 0.0) mx = 1.0;
  int64_t first = -1, n_bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::isnan(got[i]) || std::isnan(ref[i]) ? INFINITY : std::fabs(got[i] - ref[i]);
    err = std::max(err, e);
    if (e > tol * mx) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++n_bad;
    }
  }
  if (first < 0) return ::testing::AssertionSuccess();
  const int64_t t = first / (D * H), h = (first / D) % H, d = first % D;
  return ::testing::AssertionFailure() << "max err " << err / mx << " (tol " << tol << ", max|ref| " << mx << "), "
                                       << n_bad << " bad; first at [token " << t << ", head " << h << ", dim " << d
                                       << "]: got " << got[first] << " want " << ref[first];
}

class CudaAttentionTest : public test::CudaTest {
 protected:
  using test::CudaTest::down;
  using test::CudaTest::up;
  // Raw bytes (positions, block tables) to and from the device.
  void* up(const void* host, int64_t bytes) {
    void* d = dev(bytes);
    EXPECT_TRUE(cuda::copy_to_device(d, host, bytes, stream_).is_ok());
    return d;
  }
  void down(void* host, const void* d, int64_t bytes) {
    EXPECT_TRUE(cuda::copy_to_host(host, d, bytes, stream_).is_ok());
    const Status s = stream_.synchronize();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
  int32_t* dev_pos(int32_t pos) { return static_cast<int32_t*>(up(&pos, 4)); }
  void set_pos(int32_t* d_pos, int32_t pos) {
    ASSERT_TRUE(cuda::copy_to_device(d_pos, &pos, 4, stream_).is_ok());
    ASSERT_TRUE(stream_.synchronize().is_ok());
  }

  // A sequence's KV on the CPU (pool + block table, two attention layers; layer 1 is the one under
  // test) and its device mirror: logical chunk c lives in device slot n_chunks - c.
  struct Paged {
    StateLayout layout;
    std::shared_ptr<KvPool> pool;
    std::unique_ptr<SequenceState> seq;
    int64_t n_chunks = 0;
    uint8_t* d_slots = nullptr;
    cuda::KvTable table;
    std::vector<TensorView> kh, vh;  // CPU chunk views of layer 1
    std::vector<TensorView> kd, vd;  // device chunk views of layer 1
  };
  static constexpr int64_t kAttnLayer = 1;

  std::unique_ptr<Paged> make_paged(DType dtype, int64_t D, int64_t Hkv, int64_t chunk, int64_t n_kv) {
    auto p = std::make_unique<Paged>();
    StateLayout& l = p->layout;
    l.kinds = {LayerStateKind::kAttention, LayerStateKind::kAttention};
    l.n_head_kv = Hkv;
    l.head_dim = D;
    l.kv_chunk_tokens = chunk;
    l.kv_dtype = dtype;
    l.n_ctx = 1 << 20;
    p->n_chunks = (n_kv + chunk - 1) / chunk;
    p->pool = std::make_shared<KvPool>(l, Device{}, p->n_chunks + 1);
    auto seq = SequenceState::create(p->pool);
    EXPECT_TRUE(seq.is_ok());
    p->seq = std::move(*seq);
    EXPECT_TRUE(p->seq->kv_reserve(n_kv).is_ok());
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int64_t row = Hkv * D;
    std::vector<float> pos_row(static_cast<size_t>(row));
    for (int64_t c = 0; c < p->n_chunks; ++c) {
      for (int64_t a = 0; a < 2; ++a) {
        for (const TensorView& v : {p->seq->k_chunk(a, c), p->seq->v_chunk(a, c)}) {
          for (int64_t t = 0; t < chunk; ++t) {
            const bool live = c * chunk + t < n_kv;
            for (float& x : pos_row) x = live ? u(rng_) : kv_blocks(dtype) ? 0.0f : NAN;
            if (kv_blocks(dtype)) {  // a position past the last holds NaN scales
              uint8_t* dst = v.as<uint8_t>() + t * dtype_row_bytes(dtype, row);
              quant::quantize_row(dtype, pos_row.data(), dst, row);
              for (int64_t b = 0; !live && b < row / 32; ++b) {
                const uint16_t nan_scale = f32_to_fp16(NAN);
                std::memcpy(dst + dtype_block_bytes(dtype) * b, &nan_scale, 2);
              }
            } else if (dtype == DType::F16) {
              for (int64_t i = 0; i < row; ++i) v.as<uint16_t>()[t * row + i] = f32_to_fp16(pos_row[i]);
            } else {
              std::memcpy(v.as<float>() + t * row, pos_row.data(), 4 * row);
            }
          }
        }
      }
    }
    const int64_t slot_bytes = l.kv_slot_bytes();
    const int64_t per = chunk * dtype_row_bytes(dtype, row);
    p->d_slots = static_cast<uint8_t*>(dev((p->n_chunks + 1) * slot_bytes));
    std::vector<const void*> bases(static_cast<size_t>(p->n_chunks));
    for (int64_t c = 0; c < p->n_chunks; ++c) {
      uint8_t* d = p->d_slots + (p->n_chunks - c) * slot_bytes;
      EXPECT_TRUE(cuda::copy_to_device(d, p->pool->slot_data(p->seq->block_table()[c]), slot_bytes, stream_).is_ok());
      bases[c] = d;
      p->kh.push_back(p->seq->k_chunk(kAttnLayer, c));
      p->vh.push_back(p->seq->v_chunk(kAttnLayer, c));
      TensorView kd = p->kh.back(), vd = p->vh.back();
      kd.data = d + 2 * kAttnLayer * per;
      vd.data = d + (2 * kAttnLayer + 1) * per;
      kd.device = vd.device = ctx_.device;
      p->kd.push_back(kd);
      p->vd.push_back(vd);
    }
    p->table.slot_base = static_cast<const void* const*>(up(bases.data(), 8 * p->n_chunks));
    p->table.k_offset = 2 * kAttnLayer * per;
    p->table.v_offset = (2 * kAttnLayer + 1) * per;
    p->table.chunk_tokens = chunk;
    p->table.n_head_kv = Hkv;
    p->table.head_dim = D;
    p->table.dtype = dtype;
    return p;
  }

  // Head h of token t of a projection row qg [2 D H, n] (each head's q, then its gate) from element
  // `first` of the head: first 0 gives the q heads, first D the gates, as [D, H, n] strided views.
  static TensorView qg_heads(const TensorView& qg, int64_t D, int64_t H, int64_t n, int64_t first) {
    TensorView v = qg;
    v.data = static_cast<float*>(qg.data) + first;
    v.ne = {D, H, n, 1};
    v.nb = {4, 8 * D, 8 * D * H, 8 * D * H * n};
    return v;
  }

  // attention_prep's inputs, random: the projection rows qg (q_heads and gate: its views), k and v
  // [D, Hkv, n], the norm weights [D]; on the device but for k, which the callers upload (the prep
  // normalizes it in place).
  struct PrepInputs {
    Host qg, k, v, qn, kn;
    TensorView dqg, dqn, dkn, dv, q_heads, gate;
  };
  PrepInputs prep_inputs(int64_t D, int64_t H, int64_t Hkv, int64_t n) {
    PrepInputs in{Host({2 * D * H, n}), Host({D, Hkv, n}), Host({D, Hkv, n}), Host({D}), Host({D}), {}, {}, {}, {},
                  {}, {}};
    in.qg.random(rng_, -3.0f, 3.0f);
    in.k.random(rng_, -3.0f, 3.0f);
    in.v.random(rng_);
    in.qn.random(rng_, 0.5f, 1.5f);
    in.kn.random(rng_, 0.5f, 1.5f);
    in.dqg = up(in.qg);
    in.dqn = up(in.qn);
    in.dkn = up(in.kn);
    in.dv = up(in.v);
    in.q_heads = qg_heads(in.dqg, D, H, n, 0);
    in.gate = qg_heads(in.dqg, D, H, n, D);
    return in;
  }

  // attention_paged at pos0 for n tokens against the CPU attention op.
  void check_paged(DType dtype, int64_t D, int64_t Hkv, int64_t G, int64_t chunk, int64_t pos0, int64_t n,
                   int64_t max_kv, float q_amp) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " D=" << D << " Hkv=" << Hkv << " G=" << G
                                      << " chunk=" << chunk << " pos0=" << pos0 << " n=" << n
                                      << " max_kv=" << max_kv << " q_amp=" << q_amp);
    bufs_.clear();  // the previous case is done (down() synchronized): its device memory may go
    const int64_t H = Hkv * G, n_kv = pos0 + n;
    auto p = make_paged(dtype, D, Hkv, chunk, n_kv);
    Host q({D, H, n}), ref({D, H, n}), out({D, H, n});
    q.random(rng_, -q_amp, q_amp);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    ASSERT_TRUE(attention(test::fast_ctx(), q.t, p->kh, p->vh, n_kv, pos0, scale, ref.t).is_ok());
    const TensorView dout = up(out);
    const Status s = cuda::attention_paged(ctx_, up(q), p->table, dev_pos(static_cast<int32_t>(pos0)), max_kv, scale,
                                           dout);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    const ::testing::AssertionResult r = close_rel(down(dout), ref.v, tol_for(dtype, D), D, H);
    EXPECT_TRUE(r);
    if (!r) ++n_failed_;
  }
  // Sweeps stop after a few failing cases: the first ones say enough.
  bool too_many_failures() const { return HasFatalFailure() || n_failed_ >= 5; }
  int n_failed_ = 0;

  std::mt19937 rng_{4321};
};

TEST_F(CudaAttentionTest, PagedMatchesCpuAcrossShapes) {
  const int64_t kGroups[] = {1, 4, 6, 8};
  int64_t idx = 0;
  for (DType dtype : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}) {
    for (int64_t D : {32, 64, 128, 256}) {
      for (int64_t n : {1, 2, 5, 16, 17, 64, 300}) {
        for (int64_t pos0 : {0, 1, 63, 64, 1000, 5000}) {
          const int64_t G = kGroups[idx % 4];
          const int64_t chunk = (idx / 4) % 2 ? 16 : 64;
          const int64_t Hkv = idx % 3 == 0 ? 2 : 1;
          const int64_t n_kv = pos0 + n;
          const int64_t max_kv = idx % 2 ? n_kv : 4 * n_kv + 1000;  // a loose bound: empty splits
          const float q_amp = idx % 5 == 0 ? 6.0f : 1.5f;            // sometimes a peaky softmax
          ++idx;
          check_paged(dtype, D, Hkv, G, chunk, pos0, n, max_kv, q_amp);
          if (too_many_failures()) return;
        }
      }
    }
  }
}

// Qwen3.5 27B (24 heads over 4 KV heads) and 35B-A3B (16 over 2), head_dim 256, with a graph-sized
// bound of 32K positions.
TEST_F(CudaAttentionTest, PagedRealModelShapes) {
  for (DType dtype : {DType::F16, DType::F32, DType::Q8_0, DType::Q4_0}) {
    for (auto [H, Hkv] : {std::pair<int64_t, int64_t>{24, 4}, {16, 2}}) {
      for (int64_t n : {1, 4, 16, 17, 128}) {
        for (int64_t pos0 : {0, 777, 4096}) {
          check_paged(dtype, 256, Hkv, H / Hkv, 64, pos0, n, 32768, 3.0f);
          if (too_many_failures()) return;
        }
      }
    }
  }
}

// On a device whose CTAs may opt into 99 KB of shared memory (sm_86 / sm_89, emulated with
// set_smem_optin_cap), head_dim 256 does not fit the tensor-core kernel's staging: the plan takes the
// SIMT kernel, which still matches the CPU; head_dim 128 keeps the tensor cores.
TEST_F(CudaAttentionTest, SmallSharedMemoryDeviceTakesSimtAtHeadDim256) {
  const auto plan_path = [&](int64_t D) {
    cuda::AttnPagedArgs a{};  // the plan reads the KV layout, not the KV
    a.kv.dtype = DType::F16;
    a.kv.chunk_tokens = 64;
    a.kv.n_head_kv = 2;
    a.kv.head_dim = static_cast<int32_t>(D);
    a.n_head = 12;
    a.n_tokens = 64;
    a.max_kv = 300;
    cuda::AttnPlan plan{};
    EXPECT_EQ(cuda::attention_paged_plan(a, cuda::AttnPath::kAuto, 0, &plan), cudaSuccess) << "D " << D;
    return plan.path;
  };
  EXPECT_EQ(plan_path(256), cuda::AttnPath::kTensorCore);  // an H100 opts into 227 KB
  {
    const test::SmemOptinCap cap(99 * 1024);
    EXPECT_EQ(plan_path(256), cuda::AttnPath::kSimt);
    EXPECT_EQ(plan_path(128), cuda::AttnPath::kTensorCore);
    for (auto [pos0, n] : {std::pair<int64_t, int64_t>{0, 64}, {300, 17}, {4096, 1}}) {
      check_paged(DType::F16, 256, 2, 8, 64, pos0, n, 4 * (pos0 + n), 3.0f);
    }
  }
  EXPECT_EQ(plan_path(256), cuda::AttnPath::kTensorCore);
}

// Head dims the tensor-core kernel does not take run on the SIMT kernel (F16 and F32 KV; Q8_0 and Q4_0
// at the multiples of 32).
TEST_F(CudaAttentionTest, PagedOddHeadDims) {
  for (DType dtype : {DType::F16, DType::F32, DType::Q8_0, DType::Q4_0}) {
    for (int64_t D : {16, 48, 96, 200, 320, 512}) {
      if (kv_blocks(dtype) && D % 32 != 0) continue;
      for (auto [pos0, n] : {std::pair<int64_t, int64_t>{0, 1}, {70, 3}, {129, 40}}) {
        check_paged(dtype, D, 2, 3, 16, pos0, n, 4 * (pos0 + n), 2.0f);
        if (too_many_failures()) return;
      }
    }
  }
}

// Both kernels through the launcher on the same F16 (and Q8_0, Q4_0) data, several split counts implied by
// max_kv.
TEST_F(CudaAttentionTest, TensorCoreAndSimtAgree) {
  const int64_t D = 128, Hkv = 2, G = 6, H = Hkv * G, chunk = 64;
  for (DType dtype : {DType::F16, DType::Q8_0, DType::Q4_0}) {
  for (auto [pos0, n] : {std::pair<int64_t, int64_t>{0, 1}, {900, 2}, {300, 33}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " pos0=" << pos0 << " n=" << n);
    auto p = make_paged(dtype, D, Hkv, chunk, pos0 + n);
    Host q({D, H, n}), ref({D, H, n});
    q.random(rng_, -3.0f, 3.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    ASSERT_TRUE(attention(test::fast_ctx(), q.t, p->kh, p->vh, pos0 + n, pos0, scale, ref.t).is_ok());
    const TensorView dq = up(q);
    const int32_t* d_pos = dev_pos(static_cast<int32_t>(pos0));
    for (cuda::AttnPath path : {cuda::AttnPath::kTensorCore, cuda::AttnPath::kSimt}) {
      Host out({D, H, n});
      const TensorView dout = up(out);
      cuda::AttnPagedArgs a;
      a.q = dq.as<float>();
      a.o = dout.as<float>();
      a.kv.k_base = a.kv.v_base = reinterpret_cast<const uint8_t* const*>(p->table.slot_base);
      a.kv.k_offset = p->table.k_offset;
      a.kv.v_offset = p->table.v_offset;
      a.kv.dtype = dtype;
      a.kv.chunk_tokens = static_cast<int32_t>(chunk);
      a.kv.n_head_kv = static_cast<int32_t>(Hkv);
      a.kv.head_dim = static_cast<int32_t>(D);
      a.n_head = static_cast<int32_t>(H);
      a.n_tokens = static_cast<int32_t>(n);
      a.d_pos = d_pos;
      a.max_kv = 8192;
      a.scale = scale;
      cuda::AttnPlan plan;
      ASSERT_EQ(cuda::attention_paged_plan(a, path, 0, &plan), cudaSuccess);
      EXPECT_EQ(plan.path, path);
      if (path == cuda::AttnPath::kTensorCore) {  // one token's 6 rows: the transposed form
        const int64_t R = n * G;
        EXPECT_EQ(plan.rows_per_cta, R <= 8 ? 8 : R <= 16 ? 16 : R <= 32 ? 32 : 64);
      }
      if (plan.scratch_bytes > 0) a.scratch = static_cast<float*>(dev(plan.scratch_bytes));
      ASSERT_EQ(cuda::attention_paged_launch(a, plan, static_cast<cudaStream_t>(stream_.handle())), cudaSuccess);
      const double tol = path == cuda::AttnPath::kTensorCore ? kTolTensorCore : kTolF32Path;
      EXPECT_TRUE(close_rel(down(dout), ref.v, tol, D, H))
          << (path == cuda::AttnPath::kTensorCore ? "tensor core" : "simt") << " splits " << plan.n_split;
    }
  }
  }
}

// The public op (host pos0, a list of chunks) on F16, Q8_0 and Q4_0 chunks goes through the same kernels.
TEST_F(CudaAttentionTest, PublicAttentionOnF16AndBlockChunks) {
  for (DType dtype : {DType::F16, DType::Q8_0, DType::Q4_0}) {
  for (auto [pos0, n] : {std::pair<int64_t, int64_t>{0, 7}, {37, 1}, {200, 20}}) {
    const int64_t D = 64, Hkv = 2, H = 8, chunk = 16, n_kv = pos0 + n;
    auto p = make_paged(dtype, D, Hkv, chunk, n_kv);
    Host q({D, H, n}), ref({D, H, n}), out({D, H, n});
    q.random(rng_, -2.0f, 2.0f);
    const float scale = 0.125f;
    ASSERT_TRUE(attention(test::ref_ctx(), q.t, p->kh, p->vh, n_kv, pos0, scale, ref.t).is_ok());
    const TensorView dout = up(out);
    const Status s = attention(ctx_, up(q), p->kd, p->vd, n_kv, pos0, scale, dout);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_TRUE(close_rel(down(dout), ref.v, kTolTensorCore, D, H))
        << dtype_name(dtype) << " pos0=" << pos0 << " n=" << n;
  }
  }
}

// kv_append writes exactly the CPU's conversion of k / v at [pos0, pos0 + n) and nothing else.
TEST_F(CudaAttentionTest, KvAppendMatchesCpuCopy) {
  for (DType dtype : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}) {
    for (int64_t chunk : {16, 64}) {
      for (auto [pos0, n] : {std::pair<int64_t, int64_t>{0, 1}, {60, 10}, {63, 1}, {64, 64}, {5, 200}}) {
        // head_dim 96: the block types' blocks one after another; 64 and 256: spread over the lanes
        const int64_t D = chunk == 16 ? 96 : pos0 % 2 ? 256 : 64, Hkv = 2, row = D * Hkv;
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " chunk=" << chunk << " pos0=" << pos0
                                          << " n=" << n << " D=" << D);
        auto p = make_paged(dtype, D, Hkv, chunk, pos0 + n);
        Host k({D, Hkv, n}), v({D, Hkv, n});
        k.random(rng_, -70000.0f, 70000.0f);  // F16 overflow to inf included
        v.random(rng_);
        if (dtype == DType::Q8_0) k.v[5] = NAN;  // a NaN element: code 0, its block's scale from the rest
        if (dtype == DType::Q4_0) {  // ties of |x| (the first sets the scale's sign) and a block of zeros
          for (int i = 0; i < 96; ++i) k.v[i] = static_cast<float>(i % 7) - 3.0f;
          k.v[3] = 9.0f;  // ties in one lane's elements and across lanes
          k.v[7] = -9.0f;
          k.v[12] = -9.0f;
          std::fill(k.v.begin() + 32, k.v.begin() + 64, 0.0f);
          k.v[64 + 6] = -5.0f;
          k.v[64 + 30] = 5.0f;
          k.v[64 + 31] = 5.0f;
        }
        for (int64_t t = 0; t < n; ++t) {  // the expected result, on the CPU chunks
          const int64_t pos = pos0 + t, c = pos / chunk, r = pos % chunk;
          if (kv_blocks(dtype)) {
            const int64_t rb = dtype_row_bytes(dtype, row);
            quant::quantize_row(dtype, &k.v[static_cast<size_t>(t * row)], p->kh[c].as<uint8_t>() + r * rb, row);
            quant::quantize_row(dtype, &v.v[static_cast<size_t>(t * row)], p->vh[c].as<uint8_t>() + r * rb, row);
            continue;
          }
          for (int64_t i = 0; i < row; ++i) {
            const float kx = k.v[t * row + i], vx = v.v[t * row + i];
            if (dtype == DType::F16) {
              p->kh[c].as<uint16_t>()[r * row + i] = f32_to_fp16(kx);
              p->vh[c].as<uint16_t>()[r * row + i] = f32_to_fp16(vx);
            } else {
              p->kh[c].as<float>()[r * row + i] = kx;
              p->vh[c].as<float>()[r * row + i] = vx;
            }
          }
        }
        const Status s = cuda::kv_append(ctx_, up(k), up(v), p->table, dev_pos(static_cast<int32_t>(pos0)));
        ASSERT_TRUE(s.is_ok()) << s.to_string();
        const int64_t slot_bytes = p->layout.kv_slot_bytes();
        std::vector<uint8_t> got(static_cast<size_t>(slot_bytes));
        for (int64_t c = 0; c < p->n_chunks; ++c) {
          down(got.data(), p->d_slots + (p->n_chunks - c) * slot_bytes, slot_bytes);
          const uint8_t* want = p->pool->slot_data(p->seq->block_table()[c]);
          for (int64_t b = 0; b < slot_bytes; ++b) {
            if (got[b] != want[b]) {
              const int64_t rb = dtype_row_bytes(dtype, row), per = chunk * rb;
              const int64_t part = b / per, e = b % per;
              FAIL() << "chunk " << c << " byte " << b << ": layer " << part / 2 << (part % 2 ? " V" : " K")
                     << " token " << e / rb << " byte " << e % rb << " of its row (" << dtype_name(dtype) << ")";
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaAttentionTest, RopeAtDevicePosition) {
  for (int64_t pos0 : {0, 5, 4097, 200000}) {
    Host x({256, 3, 4});
    x.random(rng_);
    const TensorView dx = up(x);
    ASSERT_TRUE(rope_neox(test::ref_ctx(), x.t, 64, 1e7f, pos0).is_ok());
    const Status s = cuda::rope_neox_at(ctx_, dx, 64, 1e7f, dev_pos(static_cast<int32_t>(pos0)));
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_LE(test::rel_err(down(dx), x.v), test::kTolF32) << "pos0=" << pos0;
  }
}

// attention_prep gives the bits of the chain it replaces (rms_norm of the strided q heads and of k,
// rope_neox_at of both, kv_append) and writes the KV chunks at [pos0, pos0 + n) only; q also against the
// CPU norm and rotation.
TEST_F(CudaAttentionTest, AttentionPrepMatchesTheChain) {
  struct Case {
    int64_t D, H, Hkv, n_rot;
  };
  const float eps = 1e-6f, base = 1e7f;
  for (DType dtype : {DType::F16, DType::F32, DType::Q8_0, DType::Q4_0}) {
    for (const Case& cs : {Case{256, 16, 2, 64}, Case{128, 8, 4, 32}, Case{96, 6, 2, 96}, Case{40, 3, 1, 8}}) {
      for (auto [pos0, n] : {std::pair<int64_t, int64_t>{0, 1}, {61, 5}, {4097, 1}}) {
        const int64_t D = cs.D, H = cs.H, Hkv = cs.Hkv, chunk = 16;
        if (kv_blocks(dtype) && D % 32 != 0) continue;
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " D=" << D << " H=" << H << " Hkv=" << Hkv
                                          << " n_rot=" << cs.n_rot << " pos0=" << pos0 << " n=" << n);
        bufs_.clear();
        auto p = make_paged(dtype, D, Hkv, chunk, pos0 + n);
        const PrepInputs in = prep_inputs(D, H, Hkv, n);
        const Host &qg = in.qg, &k = in.k, &qn = in.qn;
        const TensorView &dqn = in.dqn, &dkn = in.dkn, &dv = in.dv, &q_heads = in.q_heads;
        const int64_t all_slots = (p->n_chunks + 1) * p->layout.kv_slot_bytes();
        std::vector<uint8_t> initial(static_cast<size_t>(all_slots)), chain(initial.size()), fused(initial.size());
        down(initial.data(), p->d_slots, all_slots);
        int32_t* d_pos = dev_pos(static_cast<int32_t>(pos0));

        const TensorView k1 = up(k), q1 = up(Host({D, H, n}));
        ASSERT_TRUE(rms_norm(ctx_, q_heads, dqn, eps, q1).is_ok());
        ASSERT_TRUE(rms_norm(ctx_, k1, dkn, eps, k1).is_ok());
        ASSERT_TRUE(cuda::rope_neox_at(ctx_, q1, cs.n_rot, base, d_pos).is_ok());
        ASSERT_TRUE(cuda::rope_neox_at(ctx_, k1, cs.n_rot, base, d_pos).is_ok());
        ASSERT_TRUE(cuda::kv_append(ctx_, k1, dv, p->table, d_pos).is_ok());
        down(chain.data(), p->d_slots, all_slots);

        ASSERT_TRUE(cuda::copy_to_device(p->d_slots, initial.data(), all_slots, stream_).is_ok());
        const TensorView k2 = up(k), q2 = up(Host({D, H, n}));
        const Status s = cuda::attention_prep(ctx_, q_heads, dqn, k2, dkn, dv, eps, cs.n_rot, base, p->table, d_pos, q2);
        ASSERT_TRUE(s.is_ok()) << s.to_string();
        down(fused.data(), p->d_slots, all_slots);

        const std::vector<float> q_chain = down(q1), q_fused = down(q2), k_chain = down(k1), k_fused = down(k2);
        EXPECT_EQ(0, std::memcmp(q_chain.data(), q_fused.data(), 4 * q_chain.size())) << "q bits";
        EXPECT_EQ(0, std::memcmp(k_chain.data(), k_fused.data(), 4 * k_chain.size())) << "k bits";
        EXPECT_NE(chain, initial) << "the chain appended nothing";
        for (size_t b = 0; b < chain.size(); ++b) {
          if (chain[b] != fused[b]) {
            ADD_FAILURE() << "KV slots differ at byte " << b << " of " << chain.size();
            break;
          }
        }
        // q against the CPU ops on the gathered q heads.
        Host qh({D, H, n}), qref({D, H, n});
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t h = 0; h < H; ++h) {
            std::memcpy(&qh.v[static_cast<size_t>((t * H + h) * D)], &qg.v[static_cast<size_t>((t * H + h) * 2 * D)],
                        4 * D);
          }
        }
        ASSERT_TRUE(rms_norm(test::ref_ctx(), qh.t, qn.t, eps, qref.t).is_ok());
        ASSERT_TRUE(rope_neox(test::ref_ctx(), qref.t, cs.n_rot, base, pos0).is_ok());
        EXPECT_LE(test::rel_err(q_fused, qref.v), test::kTolF32);
      }
    }
  }
}

// attention_paged_gated_q8 against attention_paged, mul_sigmoid through the strided gate view and
// quantize_q8: o and every activation byte equal. Tight bounds give one split (the combine kernel then
// gates the attention kernel's rows), the loose one many splits; tensor-core and SIMT head dims.
TEST_F(CudaAttentionTest, GatedQ8MatchesTheChain) {
  for (DType dtype : {DType::F16, DType::F32, DType::Q8_0, DType::Q4_0}) {
    for (auto [D, H, Hkv] : {std::tuple<int64_t, int64_t, int64_t>{256, 24, 4}, {256, 16, 2}, {128, 8, 4},
                             {96, 6, 2}, {32, 2, 1}}) {
      for (auto [pos0, n] : {std::pair<int64_t, int64_t>{0, 1}, {61, 5}, {4097, 1}}) {
        for (const bool tight : {true, false}) {
          const int64_t n_kv = pos0 + n, max_kv = tight ? n_kv : 32768;
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " D=" << D << " H=" << H << " Hkv=" << Hkv
                                            << " pos0=" << pos0 << " n=" << n << " max_kv=" << max_kv);
          bufs_.clear();
          auto p = make_paged(dtype, D, Hkv, 16, n_kv);
          Host q({D, H, n}), qg({2 * D * H, n});
          q.random(rng_, -2.0f, 2.0f);
          qg.random(rng_, -4.0f, 4.0f);
          if (pos0 == 61) qg.v[D + 5] = NAN;  // a NaN gate: its block's scale is NaN in both
          const TensorView dq = up(q), dqg = up(qg);
          const TensorView gate = qg_heads(dqg, D, H, n, D);  // gate of head h, token t at qg[t][h][D:2D]
          const float scale = 1.0f / std::sqrt(static_cast<float>(D));
          int32_t* d_pos = dev_pos(static_cast<int32_t>(pos0));
          const int64_t act_bytes = cuda::norm_q8_act_bytes(D * H, n);
          Host act_init({(act_bytes + 3) / 4});
          std::memset(act_init.v.data(), 0x5A, 4 * act_init.v.size());

          const TensorView o1 = up(Host({D, H, n})), a1 = up(act_init);
          ASSERT_TRUE(cuda::attention_paged(ctx_, dq, p->table, d_pos, max_kv, scale, o1).is_ok());
          ASSERT_TRUE(mul_sigmoid(ctx_, o1, gate, o1).is_ok());
          ASSERT_EQ(cuda::quantize_q8_launch(o1.as<float>(), D * H, nullptr, n, D * H, a1.data, nullptr, 0,
                                             static_cast<cudaStream_t>(ctx_.cuda_stream)),
                    cudaSuccess);

          const TensorView o2 = up(Host({D, H, n})), a2 = up(act_init);
          const Status s = cuda::attention_paged_gated_q8(ctx_, dq, p->table, d_pos, max_kv, scale, gate, o2, a2);
          ASSERT_TRUE(s.is_ok()) << s.to_string();
          const std::vector<float> oc = down(o1), of = down(o2), ac = down(a1), af = down(a2);
          EXPECT_EQ(0, std::memcmp(oc.data(), of.data(), 4 * oc.size())) << "o bits";
          EXPECT_EQ(0, std::memcmp(ac.data(), af.data(), static_cast<size_t>(act_bytes))) << "q8 activations";
          EXPECT_NE(0, std::memcmp(af.data(), act_init.v.data(), static_cast<size_t>(act_bytes))) << "nothing written";
          if (HasFailure()) return;
        }
      }
    }
  }
}

// o and its q8 activations of attention_decode_q8 against the chain's: the same bits where `exact`, else
// (the fused kernel in one split, the chain in several: another order of sums, P in half per split) o
// within 5e-3 of its largest magnitude and every int8 code within 1.
void expect_decode_rows(const std::vector<float>& oc, const std::vector<float>& of, const std::vector<float>& ac,
                        const std::vector<float>& af, int64_t n_codes, int64_t act_bytes, bool exact) {
  if (exact) {
    EXPECT_EQ(0, std::memcmp(oc.data(), of.data(), 4 * oc.size())) << "o bits";
    EXPECT_EQ(0, std::memcmp(ac.data(), af.data(), static_cast<size_t>(act_bytes))) << "q8 activations";
    return;
  }
  float big = 0.0f, worst = 0.0f;
  for (size_t i = 0; i < oc.size(); ++i) {
    big = std::max(big, std::fabs(oc[i]));
    worst = std::max(worst, std::fabs(oc[i] - of[i]));
  }
  EXPECT_GT(big, 0.0f);
  EXPECT_LE(worst, 5e-3f * big) << "o differs by " << worst << " (largest " << big << ")";
  const auto* cc = reinterpret_cast<const int8_t*>(ac.data());
  const auto* cf = reinterpret_cast<const int8_t*>(af.data());
  int worst_code = 0;
  for (int64_t i = 0; i < n_codes; ++i) worst_code = std::max(worst_code, std::abs(cc[i] - cf[i]));
  EXPECT_LE(worst_code, 1) << "q8 codes";
}

// attention_decode_q8 against attention_prep then attention_paged_gated_q8 on the same inputs: q, k (into
// k_out; k itself unchanged), every KV byte, o and every activation byte equal. The bounds give one split
// (the kernel gates its final rows), one CTA per query row (one token under a bound of at most 256: the
// same bits while the chain's splits leave one holding positions, else within rounding) and up to 33
// splits (all 16 of a 1024 bound holding positions at 1000).
TEST_F(CudaAttentionTest, DecodeQ8MatchesTheChain) {
  struct Shape {
    int64_t D, H, Hkv, n_rot;
  };
  struct Case {
    int64_t pos0, n, max_kv;
  };
  const float eps = 1e-6f, base = 1e7f;
  int64_t n_checked = 0;
  for (DType dtype : {DType::F16, DType::Q8_0, DType::Q4_0}) {
  for (const Shape& sh : {Shape{256, 24, 4, 64}, Shape{256, 16, 2, 64}, Shape{128, 8, 4, 32}, Shape{64, 4, 1, 64},
                          Shape{32, 2, 1, 16}}) {
    // {63, 2, 1024}: the two new positions fall in two splits, each appended by its own CTA.
    for (const Case& cs : {Case{0, 1, 1}, Case{0, 1, 1024}, Case{61, 1, 200}, Case{61, 2, 200}, Case{150, 1, 256},
                           Case{255, 1, 256}, Case{61, 2, 1024}, Case{63, 2, 1024}, Case{1000, 1, 1024},
                           Case{1000, 2, 1024}, Case{4097, 1, 4098}, Case{4097, 1, 32768}}) {
      const int64_t D = sh.D, H = sh.H, Hkv = sh.Hkv, n = cs.n, pos0 = cs.pos0;
      if (!cuda::attention_decode_q8_applies(dtype, D, H, Hkv, n)) continue;
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " D=" << D << " H=" << H << " Hkv=" << Hkv
                                        << " pos0=" << pos0 << " n=" << n << " max_kv=" << cs.max_kv);
      bufs_.clear();
      auto p = make_paged(dtype, D, Hkv, 16, pos0 + n);
      const PrepInputs in = prep_inputs(D, H, Hkv, n);
      const Host& k = in.k;
      const TensorView &dqn = in.dqn, &dkn = in.dkn, &dv = in.dv, &q_heads = in.q_heads, &gate = in.gate;
      const int64_t all_slots = (p->n_chunks + 1) * p->layout.kv_slot_bytes();
      std::vector<uint8_t> initial(static_cast<size_t>(all_slots)), chain(initial.size()), fused(initial.size());
      down(initial.data(), p->d_slots, all_slots);
      int32_t* d_pos = dev_pos(static_cast<int32_t>(pos0));
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      const int64_t act_bytes = cuda::norm_q8_act_bytes(D * H, n);
      Host act_init({(act_bytes + 3) / 4}), nan_rows({D, H, n});
      std::memset(act_init.v.data(), 0x5A, 4 * act_init.v.size());
      std::fill(nan_rows.v.begin(), nan_rows.v.end(), NAN);

      const TensorView k1 = up(k), q1 = up(nan_rows), o1 = up(nan_rows), a1 = up(act_init);
      ASSERT_TRUE(cuda::attention_prep(ctx_, q_heads, dqn, k1, dkn, dv, eps, sh.n_rot, base, p->table, d_pos, q1).is_ok());
      ASSERT_TRUE(cuda::attention_paged_gated_q8(ctx_, q1, p->table, d_pos, cs.max_kv, scale, gate, o1, a1).is_ok());
      down(chain.data(), p->d_slots, all_slots);

      ASSERT_TRUE(cuda::copy_to_device(p->d_slots, initial.data(), all_slots, stream_).is_ok());
      Host k_nan({D, Hkv, n});
      std::fill(k_nan.v.begin(), k_nan.v.end(), NAN);
      const TensorView k2 = up(k), k3 = up(k_nan), q2 = up(nan_rows), o2 = up(nan_rows), a2 = up(act_init);
      const Status s = cuda::attention_decode_q8(ctx_, q_heads, dqn, k2, dkn, dv, eps, sh.n_rot, base, p->table, d_pos,
                                                 cs.max_kv, scale, gate, q2, k3, o2, a2);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      down(fused.data(), p->d_slots, all_slots);

      const std::vector<float> qc = down(q1), qf = down(q2), kc = down(k1), kf = down(k3), k_in = down(k2);
      const std::vector<float> oc = down(o1), of = down(o2), ac = down(a1), af = down(a2);
      EXPECT_EQ(0, std::memcmp(qc.data(), qf.data(), 4 * qc.size())) << "q bits";
      EXPECT_EQ(0, std::memcmp(kc.data(), kf.data(), 4 * kc.size())) << "k bits";
      EXPECT_EQ(0, std::memcmp(k.v.data(), k_in.data(), 4 * k_in.size())) << "k changed";
      const bool rows_plan = n == 1 && cs.max_kv <= 256;
      expect_decode_rows(oc, of, ac, af, D * H * n, act_bytes, !rows_plan || pos0 + n <= 64);
      EXPECT_NE(0, std::memcmp(af.data(), act_init.v.data(), static_cast<size_t>(act_bytes))) << "nothing written";
      EXPECT_NE(chain, initial) << "the chain appended nothing";
      EXPECT_TRUE(chain == fused) << "KV slots differ";
      for (float x : of) {
        if (!std::isfinite(x)) {
          ADD_FAILURE() << "o has a non-finite element";
          break;
        }
      }
      ++n_checked;
      if (HasFailure()) return;
    }
  }
  }
  EXPECT_GE(n_checked, 40 + 36 + 36);  // F16, then Q8_0 and Q4_0 (no head_dim 32)
}

// attention_decode_q8 captured once as a CUDA graph (bounds 256, 1024 and 4096) and replayed at positions
// from 0 to 999 (the split holding the new position moves, and the number of splits holding positions
// goes from one to all); each replay equals the chain run op by op on the same inputs (under the bound
// of 256, one CTA per query row: within rounding once the chain's splits hold positions, past 64).
TEST_F(CudaAttentionTest, DecodeQ8ReplaysAsGraph) {
  const int64_t D = 256, H = 16, Hkv = 2, n_rot = 64;
  const float eps = 1e-6f, base = 1e7f, scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (DType dtype : {DType::F16, DType::Q8_0, DType::Q4_0}) {
  for (const int64_t max_kv : {int64_t{256}, int64_t{1024}, int64_t{4096}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " max_kv=" << max_kv);
    bufs_.clear();
    auto p = make_paged(dtype, D, Hkv, 16, 1000);
    Host qg({2 * D * H, 1}), k({D, Hkv, 1}), v({D, Hkv, 1}), qn({D}), kn({D}), rows({D, H, 1});
    qn.random(rng_, 0.5f, 1.5f);
    kn.random(rng_, 0.5f, 1.5f);
    const TensorView dqg = up(qg), dk = up(k), dv = up(v), dqn = up(qn), dkn = up(kn);
    const TensorView q_heads = qg_heads(dqg, D, H, 1, 0), gate = qg_heads(dqg, D, H, 1, D);
    const int64_t act_bytes = cuda::norm_q8_act_bytes(D * H, 1);
    Host act_h({(act_bytes + 3) / 4});
    const TensorView q = up(rows), o = up(rows), act = up(act_h), k_out = up(k);
    int32_t* d_pos = dev_pos(0);
    auto load_inputs = [&](int32_t pos, bool fresh) {
      if (fresh) {
        qg.random(rng_, -3.0f, 3.0f);
        k.random(rng_, -3.0f, 3.0f);
        v.random(rng_);
      }
      ASSERT_TRUE(cuda::copy_to_device(dqg.data, qg.v.data(), 4 * qg.v.size(), stream_).is_ok());
      ASSERT_TRUE(cuda::copy_to_device(dk.data, k.v.data(), 4 * k.v.size(), stream_).is_ok());
      ASSERT_TRUE(cuda::copy_to_device(dv.data, v.v.data(), 4 * v.v.size(), stream_).is_ok());
      set_pos(d_pos, pos);
    };
    auto fused = [&]() -> Status {
      return cuda::attention_decode_q8(ctx_, q_heads, dqn, dk, dkn, dv, eps, n_rot, base, p->table, d_pos, max_kv,
                                       scale, gate, q, k_out, o, act);
    };
    load_inputs(5, true);
    Status s = fused();  // warm-up: the scratch block comes from the cache in the capture
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    cudaGraphExec_t exec = nullptr;
    ASSERT_NO_FATAL_FAILURE(capture(fused, &exec));
    const cudaStream_t cs = static_cast<cudaStream_t>(stream_.handle());
    for (int32_t pos : {0, 17, 63, 64, 200, 255, 700, 999}) {
      if (pos >= max_kv) continue;
      load_inputs(pos, true);
      ASSERT_EQ(cudaGraphLaunch(exec, cs), cudaSuccess);
      const std::vector<float> of = down(o), af = down(act);
      load_inputs(pos, false);
      ASSERT_TRUE(cuda::attention_prep(ctx_, q_heads, dqn, dk, dkn, dv, eps, n_rot, base, p->table, d_pos, q).is_ok());
      ASSERT_TRUE(cuda::attention_paged_gated_q8(ctx_, q, p->table, d_pos, max_kv, scale, gate, o, act).is_ok());
      const std::vector<float> oc = down(o), ac = down(act);
      SCOPED_TRACE(::testing::Message() << "pos " << pos);
      expect_decode_rows(oc, of, ac, af, D * H, act_bytes, max_kv > 256 || pos + 1 <= 64);
      if (HasFailure()) return;
    }
  }
  }
}

// The launch bound a decode step is planned and its graph keyed on: 256 up to there, then multiples of
// 1024, never under the positions nor (where they fit) over the context.
TEST(AttentionLaunchBound, ShortThenThousands) {
  const int64_t ctx = int64_t{1} << 20;
  EXPECT_EQ(cuda::attention_launch_bound(1, ctx), 256);
  EXPECT_EQ(cuda::attention_launch_bound(256, ctx), 256);
  EXPECT_EQ(cuda::attention_launch_bound(257, ctx), 1024);
  EXPECT_EQ(cuda::attention_launch_bound(1024, ctx), 1024);
  EXPECT_EQ(cuda::attention_launch_bound(1025, ctx), 2048);
  EXPECT_EQ(cuda::attention_launch_bound(100, 200), 200);
  EXPECT_EQ(cuda::attention_launch_bound(300, 1000), 1000);
  EXPECT_EQ(cuda::attention_launch_bound(300, 200), 300);
}

TEST_F(CudaAttentionTest, GetRowsTrusted) {
  const int64_t n_embd = 300, n_rows = 50;
  std::vector<int32_t> ids = {3, 0, 49, 7, 3};
  const int64_t n = static_cast<int64_t>(ids.size());
  TensorView ids_h = TensorView::contiguous(ids.data(), DType::I32, {n});
  TensorView ids_d = ids_h;
  ids_d.data = up(ids.data(), 4 * n);
  ids_d.device = ctx_.device;
  for (DType t : {DType::F32, DType::F16}) {
    Host src({n_embd, n_rows}), ref({n_embd, n}), out({n_embd, n});
    src.random(rng_);
    std::vector<uint16_t> h16(src.v.size());
    for (size_t i = 0; i < h16.size(); ++i) h16[i] = f32_to_fp16(src.v[i]);
    TensorView table = t == DType::F16 ? TensorView::contiguous(h16.data(), DType::F16, {n_embd, n_rows}) : src.t;
    ASSERT_TRUE(get_rows(test::ref_ctx(), table, ids_h, ref.t).is_ok());
    TensorView table_d = table;
    table_d.data = up(table.data, table.n_bytes());
    table_d.device = ctx_.device;
    const TensorView dout = up(out);
    const Status s = cuda::get_rows_trusted(ctx_, table_d, ids_d, dout);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(down(dout), ref.v) << dtype_name(t);
  }
}

TEST_F(CudaAttentionTest, RejectsBadArguments) {
  auto p = make_paged(DType::F16, 64, 2, 16, 40);
  Host q({64, 8, 2}), o({64, 8, 2});
  const TensorView dq = up(q), dout = up(o);
  int32_t* d_pos = dev_pos(3);
  EXPECT_FALSE(cuda::attention_paged(ctx_, dq, p->table, nullptr, 64, 0.125f, dout).is_ok());
  EXPECT_FALSE(cuda::attention_paged(ctx_, dq, p->table, d_pos, 1, 0.125f, dout).is_ok());  // max_kv < n
  EXPECT_FALSE(cuda::attention_paged(ctx_, dq, p->table, d_pos, 64, 0.125f, dq).is_ok());   // o aliases q
  cuda::KvTable bad = p->table;
  bad.head_dim = 32;
  EXPECT_FALSE(cuda::attention_paged(ctx_, dq, bad, d_pos, 64, 0.125f, dout).is_ok());
  bad = p->table;
  bad.dtype = DType::BF16;
  EXPECT_FALSE(cuda::attention_paged(ctx_, dq, bad, d_pos, 64, 0.125f, dout).is_ok());
  bad = p->table;
  bad.n_head_kv = 3;  // 8 heads are not a multiple of 3
  EXPECT_FALSE(cuda::attention_paged(ctx_, dq, bad, d_pos, 64, 0.125f, dout).is_ok());
  EXPECT_FALSE(cuda::kv_append(ctx_, dq, dq, p->table, d_pos).is_ok());  // [64, 8, 2] is not [64, 2, n]
  EXPECT_FALSE(cuda::rope_neox_at(ctx_, dq, 63, 1e4f, d_pos).is_ok());
  EXPECT_FALSE(cuda::rope_neox_at(ctx_, dq, 64, 1e4f, nullptr).is_ok());
  // attention_prep: k / v [64, 2, 2], norms [64].
  Host kv_h({64, 2, 2}), w_h({64}), w_short({32}), q_big({512, 8, 2});
  const TensorView dk = up(kv_h), dvv = up(kv_h), dw = up(w_h), dws = up(w_short);
  EXPECT_TRUE(cuda::attention_prep(ctx_, dq, dw, dk, dw, dvv, 1e-6f, 64, 1e4f, p->table, d_pos, dout).is_ok());
  EXPECT_FALSE(cuda::attention_prep(ctx_, dq, dw, dk, dw, dvv, 1e-6f, 63, 1e4f, p->table, d_pos, dout).is_ok());
  EXPECT_FALSE(cuda::attention_prep(ctx_, dq, dw, dk, dw, dvv, 1e-6f, 64, 1e4f, p->table, nullptr, dout).is_ok());
  EXPECT_FALSE(cuda::attention_prep(ctx_, dq, dws, dk, dw, dvv, 1e-6f, 64, 1e4f, p->table, d_pos, dout).is_ok());
  EXPECT_FALSE(cuda::attention_prep(ctx_, dq, dw, dq, dw, dq, 1e-6f, 64, 1e4f, p->table, d_pos, dout).is_ok());
  bad = p->table;
  bad.n_head_kv = 3;
  EXPECT_FALSE(cuda::attention_prep(ctx_, dq, dw, dk, dw, dvv, 1e-6f, 64, 1e4f, bad, d_pos, dout).is_ok());
  bad = p->table;
  bad.head_dim = 512;  // more than the fused kernel takes
  const TensorView dqb = up(q_big);
  const Status big = cuda::attention_prep(ctx_, dqb, dw, dk, dw, dvv, 1e-6f, 64, 1e4f, bad, d_pos, dqb);
  EXPECT_EQ(big.code(), StatusCode::kUnsupported) << big.to_string();
  EXPECT_FALSE(cuda::attention_prep_applies(257));
  // attention_paged_gated_q8: q8 activations of [64 x 8] x 2 tokens; the gate must match o.
  Host act_h({(cuda::norm_q8_act_bytes(64 * 8, 2) + 3) / 4}), act_short({64}), gate_bad({64, 8, 1});
  const TensorView dact = up(act_h), dgate = up(o);
  EXPECT_TRUE(cuda::attention_paged_gated_q8(ctx_, dq, p->table, d_pos, 64, 0.125f, dgate, dout, dact).is_ok());
  EXPECT_FALSE(cuda::attention_paged_gated_q8(ctx_, dq, p->table, d_pos, 64, 0.125f, up(gate_bad), dout, dact).is_ok());
  EXPECT_FALSE(cuda::attention_paged_gated_q8(ctx_, dq, p->table, d_pos, 64, 0.125f, dgate, dout, up(act_short)).is_ok());
  EXPECT_FALSE(cuda::attention_paged_gated_q8(ctx_, dq, p->table, nullptr, 64, 0.125f, dgate, dout, dact).is_ok());
  Host q48({48, 8, 2});
  auto p48 = make_paged(DType::F16, 48, 2, 16, 40);
  const TensorView dq48 = up(q48), do48 = up(q48), dg48 = up(q48);
  const Status odd = cuda::attention_paged_gated_q8(ctx_, dq48, p48->table, d_pos, 64, 0.125f, dg48, do48, dact);
  EXPECT_EQ(odd.code(), StatusCode::kUnsupported) << odd.to_string();
  EXPECT_FALSE(cuda::attention_gated_q8_applies(48));
  // attention_decode_q8: F16 KV, tensor-core head dims, at most 16 query rows per KV head.
  EXPECT_TRUE(cuda::attention_decode_q8_applies(DType::F16, 64, 8, 2, 2));
  EXPECT_FALSE(cuda::attention_decode_q8_applies(DType::F16, 64, 8, 2, 5));  // 20 rows per KV head
  EXPECT_FALSE(cuda::attention_decode_q8_applies(DType::F32, 64, 8, 2, 1));
  EXPECT_FALSE(cuda::attention_decode_q8_applies(DType::F16, 96, 6, 2, 1));
  const TensorView dq1 = up(Host({64, 8, 1})), dqo1 = up(Host({64, 8, 1})), do1 = up(Host({64, 8, 1}));
  const TensorView dg1 = up(Host({64, 8, 1})), dk1 = up(Host({64, 2, 1})), dv1 = up(Host({64, 2, 1}));
  const TensorView dko1 = up(Host({64, 2, 1}));
  const Status one = cuda::attention_decode_q8(ctx_, dq1, dw, dk1, dw, dv1, 1e-6f, 64, 1e4f, p->table, d_pos, 64,
                                               0.125f, dg1, dqo1, dko1, do1, dact);
  EXPECT_TRUE(one.is_ok()) << one.to_string();
  EXPECT_FALSE(cuda::attention_decode_q8(ctx_, dq1, dw, dk1, dw, dv1, 1e-6f, 64, 1e4f, p->table, nullptr, 64, 0.125f,
                                         dg1, dqo1, dko1, do1, dact)
                   .is_ok());
  EXPECT_FALSE(cuda::attention_decode_q8(ctx_, dq1, dw, dk1, dw, dv1, 1e-6f, 63, 1e4f, p->table, d_pos, 64, 0.125f,
                                         dg1, dqo1, dko1, do1, dact)
                   .is_ok());
  EXPECT_FALSE(cuda::attention_decode_q8(ctx_, dq1, dw, dk1, dw, dv1, 1e-6f, 64, 1e4f, p->table, d_pos, 64, 0.125f,
                                         dg1, dqo1, dko1, do1, up(act_short))
                   .is_ok());
  // k_out: k's shape, and not k itself (the kernel's CTAs read k while others write k_out).
  EXPECT_FALSE(cuda::attention_decode_q8(ctx_, dq1, dw, dk1, dw, dv1, 1e-6f, 64, 1e4f, p->table, d_pos, 64, 0.125f,
                                         dg1, dqo1, dk1, do1, dact)
                   .is_ok());
  EXPECT_FALSE(cuda::attention_decode_q8(ctx_, dq1, dw, dk1, dw, dv1, 1e-6f, 64, 1e4f, p->table, d_pos, 64, 0.125f,
                                         dg1, dqo1, up(Host({64, 1, 1})), do1, dact)
                   .is_ok());
  // Q8_0 and Q4_0: the tensor-core head dims but 32 (34- and 18-byte rows), and head_dim a multiple of 32
  // anywhere.
  for (DType kv : {DType::Q8_0, DType::Q4_0}) {
    EXPECT_TRUE(cuda::attention_decode_q8_applies(kv, 256, 16, 2, 1));
    EXPECT_TRUE(cuda::attention_decode_q8_applies(kv, 64, 8, 2, 2));
    EXPECT_FALSE(cuda::attention_decode_q8_applies(kv, 32, 2, 1, 1));
  }
  for (DType kv : {DType::Q8_0, DType::Q4_0}) {
    auto q80 = make_paged(kv, 64, 2, 16, 40);
    bad = q80->table;
    bad.head_dim = 48;
    Host q48b({48, 8, 2});
    const TensorView dq48b = up(q48b), do48b = up(q48b);
    const Status q8odd = cuda::attention_paged(ctx_, dq48b, bad, d_pos, 64, 0.125f, do48b);
    EXPECT_EQ(q8odd.code(), StatusCode::kUnsupported) << q8odd.to_string();
    Host qc({64, 2, 16});
    EXPECT_FALSE(copy(ctx_, up(qc), q80->kd[0]).is_ok());  // on CUDA the KV append quantizes, not copy
  }
  const Status f32 = cuda::attention_decode_q8(ctx_, dq1, dw, dk1, dw, dv1, 1e-6f, 64, 1e4f,
                                               make_paged(DType::F32, 64, 2, 16, 40)->table, d_pos, 64, 0.125f, dg1,
                                               dqo1, dko1, do1, dact);
  EXPECT_EQ(f32.code(), StatusCode::kUnsupported) << f32.to_string();
  EXPECT_TRUE(stream_.synchronize().is_ok());
}

// One decode step (kv_append, rope_neox_at, attention_paged) captured once as a CUDA graph, then
// replayed at several positions set in device memory; each replay is checked against the CPU ops
// applied to a mirror of the same KV.
TEST_F(CudaAttentionTest, DecodeStepReplaysAsGraph) {
  const int64_t D = 128, Hkv = 2, H = 12, chunk = 16, n_rot = 32, max_kv = 512;
  const float base = 1e6f, scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto p = make_paged(DType::F16, D, Hkv, chunk, 320);
  Host q({D, H, 1}), k({D, Hkv, 1}), v({D, Hkv, 1}), out({D, H, 1});
  const TensorView dq = up(q), dk = up(k), dv = up(v), dout = up(out);
  int32_t* d_pos = dev_pos(0);
  auto step = [&]() -> Status {
    DS_TRY(cuda::kv_append(ctx_, dk, dv, p->table, d_pos));
    DS_TRY(cuda::rope_neox_at(ctx_, dq, n_rot, base, d_pos));
    return cuda::attention_paged(ctx_, dq, p->table, d_pos, max_kv, scale, dout);
  };
  auto load_inputs = [&](int32_t pos) {
    q.random(rng_, -3.0f, 3.0f);
    k.random(rng_);
    v.random(rng_);
    ASSERT_TRUE(cuda::copy_to_device(dq.data, q.v.data(), 4 * D * H, stream_).is_ok());
    ASSERT_TRUE(cuda::copy_to_device(dk.data, k.v.data(), 4 * D * Hkv, stream_).is_ok());
    ASSERT_TRUE(cuda::copy_to_device(dv.data, v.v.data(), 4 * D * Hkv, stream_).is_ok());
    set_pos(d_pos, pos);
  };
  auto check = [&](int32_t pos, const char* what) {  // the CPU mirror takes the same step
    const int64_t c = pos / chunk, r = pos % chunk;
    for (int64_t i = 0; i < D * Hkv; ++i) {
      p->kh[c].as<uint16_t>()[r * D * Hkv + i] = f32_to_fp16(k.v[i]);
      p->vh[c].as<uint16_t>()[r * D * Hkv + i] = f32_to_fp16(v.v[i]);
    }
    ASSERT_TRUE(rope_neox(test::ref_ctx(), q.t, n_rot, base, pos).is_ok());
    Host ref({D, H, 1});
    ASSERT_TRUE(attention(test::fast_ctx(), q.t, p->kh, p->vh, pos + 1, pos, scale, ref.t).is_ok());
    EXPECT_TRUE(close_rel(down(dout), ref.v, kTolTensorCore, D, H)) << what << " pos " << pos;
  };
  // Warm-up outside the capture: the split scratch comes from the cache afterwards.
  load_inputs(5);
  Status s = step();
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  check(5, "warm-up");

  const cudaStream_t cs = static_cast<cudaStream_t>(stream_.handle());
  cudaGraphExec_t exec = nullptr;
  ASSERT_NO_FATAL_FAILURE(capture(step, &exec));
  for (int32_t pos : {0, 17, 63, 64, 200, 319}) {
    load_inputs(pos);
    ASSERT_EQ(cudaGraphLaunch(exec, cs), cudaSuccess);
    check(pos, "graph replay");
  }
}

#endif  // DS_HAVE_CUDA

}  // namespace
}  // namespace ds
