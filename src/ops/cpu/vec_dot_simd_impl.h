// Weight unpacking and the gemm tile loops for the SIMD paths (see vec_dot_simd.h for the vector
// primitives and the unpack-once-per-row scheme). Three families:
//   K-quants (Q4_K, Q5_K, Q6_K) x Q8_K activations: integer sums scaled per element pair,
//     one float multiply per 256-element super-block; the mins / the Q6_K -32 offset come from the
//     activation bsums.
//   32-element types (Q4_0, Q5_0, Q5_1, Q8_0) x Q8_0 activations: one float scale per block.
//   Float weights (F32, F16, BF16) x F32 activations.
#include "ops/cpu/vec_dot_simd.h"

namespace ds::cpu::DS_SIMD_NS {
namespace {

// One 256-element super-block of weights, unpacked.
struct KBlock {
  uint8_t q[kQK_K];   // codes in element order (0..15 / 0..31 / 0..63)
  int16_t sc[kQK_K / 2];  // integer sub-block scale of each element pair
  float mf[16];       // -dmin * min (Q6_K: -d * 32 * scale) of each 16-element group
  float d;
  uint8_t pad[60];
};
static_assert(sizeof(KBlock) == 640, "KBlock keeps 64-byte multiples");
constexpr int64_t kKChunkBlocks = 8;  // 5 KiB of unpacked weights per chunk

// Per activation super-block: the float sum of each 16-element group (d * bsums).
struct KActSums {
  float s[16];
};

// One 32-element block, unpacked.
struct LBlock {
  uint8_t u[32];  // |code| for signed types, the code itself for Q5_1
  int8_t s[32];   // signed code (unused for Q5_1)
  float d, m;     // m: Q5_1 offset
};
constexpr int64_t kLChunkBlocks = 128;  // 9 KiB of unpacked weights per chunk

// Software prefetch of the weight stream kPrefetchBytes ahead: hardware prefetchers lose long
// rows of some widths (measured: ~4x slower matrix-vector products at 17408 columns without it).
constexpr int64_t kPrefetchBytes = 4096;
inline void prefetch_range(const void* p, int64_t bytes, int64_t distance = kPrefetchBytes) {
  const char* c = static_cast<const char*>(p) + distance;
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
}

// Shuffle controls for expanding per-sub-block bytes: kRepeat16[k] puts byte k in all 16 slots;
// kRepeat8x2[k] puts byte 2k in the first 8 and byte 2k+1 in the last 8; kRepeat2 doubles 0..7.
struct ShuffleTables {
  alignas(16) uint8_t repeat16[8][16];
  alignas(16) uint8_t repeat8x2[8][16];
  alignas(16) uint8_t repeat2[16];
  ShuffleTables() {
    for (int k = 0; k < 8; ++k) {
      for (int i = 0; i < 16; ++i) {
        repeat16[k][i] = static_cast<uint8_t>(k);
        repeat8x2[k][i] = static_cast<uint8_t>(2 * k + i / 8);
      }
    }
    for (int i = 0; i < 16; ++i) repeat2[i] = static_cast<uint8_t>(i / 2);
  }
};
const ShuffleTables kShuffle;

inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// The 8 six-bit scales and mins of a Q4_K / Q5_K block (spec section 6), four at a time, into
// the low 8 bytes of *sc and *m (built in registers: a byte-wise store then a vector load would
// stall on store forwarding).
inline void unpack_k_scales(const uint8_t* s12, __m128i* sc, __m128i* m) {
  uint32_t u[3];
  std::memcpy(u, s12, 12);
  const uint32_t lo6 = 0x3F3F3F3F, lo4 = 0x0F0F0F0F, lo2 = 0x03030303;
  const uint32_t sc_lo = u[0] & lo6, m_lo = u[1] & lo6;
  const uint32_t sc_hi = (u[2] & lo4) | (((u[0] >> 6) & lo2) << 4);
  const uint32_t m_hi = ((u[2] >> 4) & lo4) | (((u[1] >> 6) & lo2) << 4);
  *sc = _mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), 0, 0);
  *m = _mm_setr_epi32(static_cast<int>(m_lo), static_cast<int>(m_hi), 0, 0);
}

// Scales of 32-element sub-blocks (Q4_K / Q5_K) into KBlock::sc, mins into KBlock::mf.
inline void expand_k_scales(const uint8_t* s12, float dmin, KBlock* out) {
  __m128i vs, vm;
  unpack_k_scales(s12, &vs, &vm);
  for (int k = 0; k < 8; ++k) {
    store256(out->sc + 16 * k, _mm256_cvtepu8_epi16(_mm_shuffle_epi8(vs, load128(kShuffle.repeat16[k]))));
  }
  vm = _mm_shuffle_epi8(vm, load128(kShuffle.repeat2));
  vf_store(out->mf, vf_mul(vf_from_i(vi_from_u8x16(vm)), vf_set1(-dmin)));
}

void unpack_q4_k(const BlockQ4_K* b, int64_t nb, KBlock* out) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < nb; ++i) {
    for (int c = 0; c < 4; ++c) {
      const __m256i v = load256(b[i].qs + 32 * c);
      store256(out[i].q + 64 * c, _mm256_and_si256(v, low));
      store256(out[i].q + 64 * c + 32, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
    }
    expand_k_scales(b[i].scales, _cvtsh_ss(b[i].dmin), &out[i]);
    out[i].d = _cvtsh_ss(b[i].d);
  }
}

void unpack_q5_k(const BlockQ5_K* b, int64_t nb, KBlock* out) {
  const __m256i low = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i qh = load256(b[i].qh);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = load256(b[i].qs + 32 * c);
      const __m256i m0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
      const __m256i m1 = _mm256_set1_epi8(static_cast<char>(2 << (2 * c)));
      const __m256i h0 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m0), m0), bit4);
      const __m256i h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m1), m1), bit4);
      store256(out[i].q + 64 * c, _mm256_or_si256(_mm256_and_si256(v, low), h0));
      store256(out[i].q + 64 * c + 32, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), h1));
    }
    expand_k_scales(b[i].scales, _cvtsh_ss(b[i].dmin), &out[i]);
    out[i].d = _cvtsh_ss(b[i].d);
  }
}

// Q6_K: codes 0..63; the -32 offset becomes a min of 32 * scale per 16-element sub-block.
void unpack_q6_k(const BlockQ6_K* b, int64_t nb, KBlock* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(0x03);
  for (int64_t i = 0; i < nb; ++i) {
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load256(b[i].ql + 64 * h), ql1 = load256(b[i].ql + 64 * h + 32);
      const __m256i qh = load256(b[i].qh + 32 * h);
      auto code = [&](__m256i ql, int ql_shift, int qh_shift) {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, ql_shift), low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, qh_shift), low2);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
      };
      uint8_t* q = out[i].q + 128 * h;
      store256(q, code(ql0, 0, 0));
      store256(q + 32, code(ql1, 0, 2));
      store256(q + 64, code(ql0, 4, 4));
      store256(q + 96, code(ql1, 4, 6));
    }
    const __m128i vs = load128(b[i].scales);
    for (int k = 0; k < 8; ++k) {
      store256(out[i].sc + 16 * k, _mm256_cvtepi8_epi16(_mm_shuffle_epi8(vs, load128(kShuffle.repeat8x2[k]))));
    }
    const float d = _cvtsh_ss(b[i].d);
    vf_store(out[i].mf, vf_mul(vf_from_i(vi_from_s8x16(vs)), vf_set1(-32.0f * d)));
    out[i].d = d;
  }
}

void unpack_k(DType t, const void* row, int64_t nb, KBlock* out) {
  prefetch_range(row, nb * dtype_block_bytes(t));
  switch (t) {
    case DType::Q4_K: return unpack_q4_k(static_cast<const BlockQ4_K*>(row), nb, out);
    case DType::Q5_K: return unpack_q5_k(static_cast<const BlockQ5_K*>(row), nb, out);
    case DType::Q6_K: return unpack_q6_k(static_cast<const BlockQ6_K*>(row), nb, out);
    default: DS_CHECK(false, "unpack_k: {}", dtype_name(t));
  }
}

void k_act_sums(const BlockQ8_K* a, int64_t nb, KActSums* out) {
  for (int64_t i = 0; i < nb; ++i) {
    vf_store(out[i].s, vf_mul(vf_from_i(vi_from_s16x16(load256(a[i].bsums))), vf_set1(a[i].d)));
  }
}

// out[r * out_stride + t] = dot(unpacked row w[r], activation row a[t]) for R rows x T tokens;
// sums[t]: a[t]'s group sums. Each activation load feeds R rows.
template <int R, int T>
void k_dot(const KBlock* const* w, int64_t nb, const BlockQ8_K* const* a, const KActSums* const* sums, float* out,
           int out_stride) {
  VF acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = vf_zero();
  }
  for (int64_t i = 0; i < nb; ++i) {
    VI isum[R][T];
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < T; ++t) isum[r][t] = vi_zero();
    }
    for (int c = 0; c < 4; ++c) {
      VI wq[R], sc[R];
      for (int r = 0; r < R; ++r) {
        wq[r] = vi_load(w[r][i].q + 64 * c);
        sc[r] = vi_load(w[r][i].sc + 32 * c);
      }
      for (int t = 0; t < T; ++t) {
        const VI av = vi_load(a[t][i].qs + 64 * c);
        for (int r = 0; r < R; ++r) isum[r][t] = vi_dot_scaled(isum[r][t], wq[r], av, sc[r]);
      }
    }
    for (int t = 0; t < T; ++t) {
      const VF as = vf_load(sums[t][i].s);
      const float da = a[t][i].d;
      for (int r = 0; r < R; ++r) {
        acc[r][t] = vf_fma(vf_from_i(isum[r][t]), vf_set1(w[r][i].d * da), acc[r][t]);
        acc[r][t] = vf_fma(vf_load(w[r][i].mf), as, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) out[r * out_stride + t] = vf_sum(acc[r][t]);
  }
}

// Byte j of the result is 0xFF where bit j of bits is set, else 0.
inline __m256i expand_bits32(uint32_t bits) {
  const __m256i ctrl = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), ctrl);
  return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, sel), sel);
}

void unpack_legacy(DType t, const uint8_t* row, int64_t nb, LBlock* out) {
  prefetch_range(row, nb * dtype_block_bytes(t));
  if (t == DType::Q8_0) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(row);
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i s = load256(b[i].qs);
      store256(out[i].s, s);
      store256(out[i].u, _mm256_abs_epi8(s));
      out[i].d = _cvtsh_ss(b[i].d);
    }
  } else if (t == DType::Q4_0) {
    const auto* b = reinterpret_cast<const BlockQ4_0*>(row);
    const __m128i low = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; ++i) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
      const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
      const __m256i s = _mm256_sub_epi8(q, _mm256_set1_epi8(8));
      store256(out[i].s, s);
      store256(out[i].u, _mm256_abs_epi8(s));
      out[i].d = _cvtsh_ss(b[i].d);
    }
  } else {  // Q5_0, Q5_1
    const bool is_q5_1 = t == DType::Q5_1;
    const int64_t bb = dtype_block_bytes(t);
    const __m128i low = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; ++i) {
      const uint8_t* blk = row + i * bb;
      const auto* b0 = reinterpret_cast<const BlockQ5_0*>(blk);
      const auto* b1 = reinterpret_cast<const BlockQ5_1*>(blk);
      const __m128i v = load128(is_q5_1 ? b1->qs : b0->qs);
      uint32_t qh;
      std::memcpy(&qh, is_q5_1 ? b1->qh : b0->qh, 4);
      const __m256i lo4 = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
      const __m256i q = _mm256_or_si256(lo4, _mm256_and_si256(expand_bits32(qh), _mm256_set1_epi8(0x10)));
      if (is_q5_1) {
        store256(out[i].u, q);
      } else {
        const __m256i sq = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        store256(out[i].s, sq);
        store256(out[i].u, _mm256_abs_epi8(sq));
      }
      out[i].d = _cvtsh_ss(is_q5_1 ? b1->d : b0->d);
      out[i].m = is_q5_1 ? _cvtsh_ss(b1->m) : 0.0f;
    }
  }
}

// out[t] = dot(unpacked row w, activation row a[t]) for T tokens.
template <int T, bool kUnsigned>
void legacy_dot(const LBlock* w, int64_t nb, const BlockQ8_0* const* a, float* out) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < nb; ++i) {
    const LBlock& u = w[i];
    const __m256i wu = load256(u.u);
    const __m256i ws = load256(u.s);
    for (int t = 0; t < T; ++t) {
      const __m256i av = load256(a[t][i].qs);
      const float da = _cvtsh_ss(a[t][i].d);
      if constexpr (kUnsigned) {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32_unsigned(wu, av)), _mm256_set1_ps(u.d * da), acc[t]);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32_unsigned(ones, av)), _mm256_set1_ps(u.m * da), acc[t]);
      } else {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32_signed(wu, ws, av)), _mm256_set1_ps(u.d * da), acc[t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) out[t] = hsum256(acc[t]);
}

template <DType W>
inline VF load_weights(const void* w, int64_t k) {
  if constexpr (W == DType::F32) return vf_load(static_cast<const float*>(w) + k);
  if constexpr (W == DType::F16) return vf_load_f16(static_cast<const uint16_t*>(w) + k);
  if constexpr (W == DType::BF16) return vf_load_bf16(static_cast<const uint16_t*>(w) + k);
}

// Element k of a float-type row; memcpy because rows need not be aligned to the element size.
template <DType W>
inline float weight_scalar(const void* w, int64_t k) {
  const auto* b = static_cast<const uint8_t*>(w);
  if constexpr (W == DType::F32) {
    float v;
    std::memcpy(&v, b + 4 * k, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, b + 2 * k, 2);
  if constexpr (W == DType::F16) return fp16_to_f32(h);
  return bf16_to_f32(h);
}

inline float load_f32(const float* p, int64_t k) {
  float v;
  std::memcpy(&v, reinterpret_cast<const uint8_t*>(p) + 4 * k, 4);
  return v;
}

// out[r * out_stride + t] = dot(w[r][0..n), x[t][0..n)) for R rows x T tokens.
template <DType W, int R, int T>
void float_dot(const uint8_t* const* w, int64_t n, const float* const* x, float* out, int out_stride) {
  VF acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = vf_zero();
  }
  constexpr int64_t kBytes = W == DType::F32 ? 4 : 2;
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    VF wv[R];
    for (int r = 0; r < R; ++r) {
      if (kBytes == 4 || k % 32 == 0) _mm_prefetch(reinterpret_cast<const char*>(w[r]) + k * kBytes + kPrefetchBytes, _MM_HINT_T0);
      wv[r] = load_weights<W>(w[r], k);
    }
    for (int t = 0; t < T; ++t) {
      const VF xv = vf_load(x[t] + k);
      for (int r = 0; r < R; ++r) acc[r][t] = vf_fma(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float sum = vf_sum(acc[r][t]);
      for (int64_t j = k; j < n; ++j) sum += weight_scalar<W>(w[r], j) * load_f32(x[t], j);
      out[r * out_stride + t] = sum;
    }
  }
}

template <DType W>
void float_tile(int64_t n, const uint8_t* w, size_t w_row_bytes, int64_t r0, int64_t r1, const uint8_t* act,
                size_t act_row_bytes, int64_t n_tokens, float* y, int64_t y_stride) {
  // Columns in chunks of 4096 elements so the chunk of every token's activations stays in L2
  // while the rows' weights pass; "blocks" here are single elements.
  constexpr int64_t kChunk = 4096;
  constexpr int64_t kBytes = W == DType::F32 ? 4 : 2;
  const uint8_t* rows[kFRows];
  for_row_tokens<kFRows, kFTokens>(
      r0, r1, n_tokens, y, y_stride, n, kChunk,
      [&](int slot, int64_t r, int64_t b0, int64_t) { rows[slot] = w + r * w_row_bytes + b0 * kBytes; },
      [&](int nr, int64_t t0, int nt, int64_t b0, int64_t nbc, float* out) {
        const float* x[kFTokens];
        for (int j = 0; j < nt; ++j) x[j] = reinterpret_cast<const float*>(act + (t0 + j) * act_row_bytes) + b0;
        with_tokens<kFRows>(nr, [&]<int R>() {
          with_tokens<kFTokens>(nt, [&]<int T>() { float_dot<W, R, T>(rows, nbc, x, out, kFTokens); });
        });
      });
}

#include "ops/cpu/vec_dot_simd_fused.h"

void gemm_tile_impl(DType t, int64_t n, const void* wv, size_t w_row_bytes, int64_t r0, int64_t r1,
                    const void* actv, size_t act_row_bytes, int64_t n_tokens, float* y, int64_t y_stride) {
  const auto* w = static_cast<const uint8_t*>(wv);
  const auto* act = static_cast<const uint8_t*>(actv);
  switch (t) {
    case DType::F32: return float_tile<DType::F32>(n, w, w_row_bytes, r0, r1, act, act_row_bytes, n_tokens, y, y_stride);
    case DType::F16: return float_tile<DType::F16>(n, w, w_row_bytes, r0, r1, act, act_row_bytes, n_tokens, y, y_stride);
    case DType::BF16: return float_tile<DType::BF16>(n, w, w_row_bytes, r0, r1, act, act_row_bytes, n_tokens, y, y_stride);
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: {
      const int64_t nb = n / kQK_K;
      thread_local std::vector<KBlock> buf(kKRows * kKChunkBlocks);
      thread_local std::vector<KActSums> sums;
      if (static_cast<int64_t>(sums.size()) < nb * n_tokens) sums.resize(static_cast<size_t>(nb * n_tokens));
      for (int64_t tk = 0; tk < n_tokens; ++tk) {
        k_act_sums(reinterpret_cast<const BlockQ8_K*>(act + tk * act_row_bytes), nb, sums.data() + tk * nb);
      }
#if DS_SIMD_512
      if (n_tokens < kRowGroupMinTokens) {
        k_fused_tile(t, nb, w, w_row_bytes, r0, r1, act, act_row_bytes, sums.data(), n_tokens, y, y_stride);
        return;
      }
#endif
      const int64_t wb = dtype_block_bytes(t);
      const KBlock* rows[kKRows];
      for (int slot = 0; slot < kKRows; ++slot) rows[slot] = buf.data() + slot * kKChunkBlocks;
      for_row_tokens<kKRows, kKTokens>(
          r0, r1, n_tokens, y, y_stride, nb, kKChunkBlocks,
          [&](int slot, int64_t r, int64_t b0, int64_t nbc) {
            unpack_k(t, w + r * w_row_bytes + b0 * wb, nbc, buf.data() + slot * kKChunkBlocks);
          },
          [&](int nr, int64_t t0, int nt, int64_t b0, int64_t nbc, float* out) {
            const BlockQ8_K* a[kKTokens];
            const KActSums* s[kKTokens];
            for (int j = 0; j < nt; ++j) {
              a[j] = reinterpret_cast<const BlockQ8_K*>(act + (t0 + j) * act_row_bytes) + b0;
              s[j] = sums.data() + (t0 + j) * nb + b0;
            }
            with_tokens<kKRows>(nr, [&]<int R>() {
              with_tokens<kKTokens>(nt, [&]<int T>() { k_dot<R, T>(rows, nbc, a, s, out, kKTokens); });
            });
          });
      return;
    }
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0: {
      const int64_t nb = n / 32;
#if DS_SIMD_512
      if ((t == DType::Q8_0 || t == DType::Q4_0) && n_tokens < kRowGroupMinTokens) {
        legacy_fused_tile(t, nb, w, w_row_bytes, r0, r1, act, act_row_bytes, n_tokens, y, y_stride);
        return;
      }
#endif
      thread_local std::vector<LBlock> buf(kLChunkBlocks);
      const int64_t wb = dtype_block_bytes(t);
      static_assert(kLRows == 1, "legacy kernels take one row");
      for_row_tokens<kLRows, kLTokens>(
          r0, r1, n_tokens, y, y_stride, nb, kLChunkBlocks,
          [&](int, int64_t r, int64_t b0, int64_t nbc) {
            unpack_legacy(t, w + r * w_row_bytes + b0 * wb, nbc, buf.data());
          },
          [&](int, int64_t t0, int nt, int64_t b0, int64_t nbc, float* out) {
            const BlockQ8_0* a[kLTokens];
            for (int j = 0; j < nt; ++j) a[j] = reinterpret_cast<const BlockQ8_0*>(act + (t0 + j) * act_row_bytes) + b0;
            if (t == DType::Q5_1) {
              with_tokens<kLTokens>(nt, [&]<int T>() { legacy_dot<T, true>(buf.data(), nbc, a, out); });
            } else {
              with_tokens<kLTokens>(nt, [&]<int T>() { legacy_dot<T, false>(buf.data(), nbc, a, out); });
            }
          });
      return;
    }
    default:
      DS_CHECK(false, "gemm_tile: unsupported weight type {}", dtype_name(t));
  }
}

// One row and one token without the tile machinery: vec_dot is called per attention position
// with short rows, where the tile loop's setup would cost as much as the product.
float vec_dot_impl(DType t, int64_t n, const void* wv, const void* av) {
  const auto* w = static_cast<const uint8_t*>(wv);
  float out = 0.0f;
  const uint8_t* rows[1] = {w};
  const float* x[1] = {static_cast<const float*>(av)};
  switch (t) {
    case DType::F32: float_dot<DType::F32, 1, 1>(rows, n, x, &out, 1); return out;
    case DType::F16: float_dot<DType::F16, 1, 1>(rows, n, x, &out, 1); return out;
    case DType::BF16: float_dot<DType::BF16, 1, 1>(rows, n, x, &out, 1); return out;
#if DS_SIMD_512
    case DType::Q8_0: {
      const BlockQ8_0* a[1] = {static_cast<const BlockQ8_0*>(av)};
      q8_0_fused<1>(reinterpret_cast<const BlockQ8_0*>(w), n / kQK8_0, a, &out);
      return out;
    }
    case DType::Q4_0: {
      const BlockQ8_0* a[1] = {static_cast<const BlockQ8_0*>(av)};
      q4_0_fused<1>(reinterpret_cast<const BlockQ4_0*>(w), n / kQK4_0, a, &out);
      return out;
    }
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: {
      const int64_t nb = n / kQK_K;
      constexpr int64_t kStackBlocks = 32;
      KActSums local[kStackBlocks];
      thread_local std::vector<KActSums> heap;
      KActSums* sums = local;
      if (nb > kStackBlocks) {
        if (static_cast<int64_t>(heap.size()) < nb) heap.resize(static_cast<size_t>(nb));
        sums = heap.data();
      }
      const BlockQ8_K* a[1] = {static_cast<const BlockQ8_K*>(av)};
      k_act_sums(a[0], nb, sums);
      const KActSums* s[1] = {sums};
      if (t == DType::Q4_K) {
        q45k_fused<1, false>(w, nb, a, s, &out);
      } else if (t == DType::Q5_K) {
        q45k_fused<1, true>(w, nb, a, s, &out);
      } else {
        q6k_fused<1>(reinterpret_cast<const BlockQ6_K*>(w), nb, a, s, &out);
      }
      return out;
    }
#endif
    default:
      gemm_tile_impl(t, n, wv, 0, 0, 1, av, 0, 1, &out, 1);
      return out;
  }
}

}  // namespace
}  // namespace ds::cpu::DS_SIMD_NS
