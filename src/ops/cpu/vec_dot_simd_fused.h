// AVX-512 matrix-vector kernels for the K-quants, Q8_0 and Q4_0 that decode each
// block straight into registers instead of through the unpack buffer. With one to a few
// tokens there is nothing to amortise a buffer over, and skipping its stores and reloads makes the
// product bound by weight bandwidth rather than by unpacking. Part of vec_dot_simd_impl.h.
#if DS_SIMD_512

// Index vectors for vpermw: int16 lane l of chunk c takes scale kQ4Idx (Q4_K: 2c + l / 16) or
// kQ6Idx (Q6_K: 4c + l / 8) of the block's scale vector.
struct FusedTables {
  alignas(64) int16_t q4[4][32];
  alignas(64) int16_t q6[4][32];
  FusedTables() {
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        q4[c][l] = static_cast<int16_t>(2 * c + l / 16);
        q6[c][l] = static_cast<int16_t>(4 * c + l / 8);
      }
    }
  }
};
const FusedTables kFused;

// The fused kernels consume weights about twice as fast as the buffered ones, so they prefetch
// further ahead (measured best of 2/4/8/12 KiB at 5120 and 17408 columns).
constexpr int64_t kFusedPrefetchBytes = 12288;

inline __m512i join256(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// Q4_K, or Q5_K when kFive (the fifth bit of element 64c + l is bit 2c of qh[l], of element
// 64c + 32 + l bit 2c + 1).
template <int T, bool kFive>
void q45k_fused(const uint8_t* wv, int64_t nb, const BlockQ8_K* const* a, const KActSums* const* sums, float* out) {
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  const auto* w = reinterpret_cast<const Block*>(wv);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  for (int64_t i = 0; i < nb; ++i) {
    if (i % 8 == 0) prefetch_range(w + i, 8 * static_cast<int64_t>(sizeof(Block)), kFusedPrefetchBytes);
    __m128i vs, vm;
    unpack_k_scales(w[i].scales, &vs, &vm);
    const __m512i s16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(vs));
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = load256(w[i].qh);
    __m512i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m256i v = load256(w[i].qs + 32 * c);
      __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      if constexpr (kFive) {
        const __m256i m0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
        const __m256i m1 = _mm256_set1_epi8(static_cast<char>(2 << (2 * c)));
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m0), m0), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m1), m1), bit4));
      }
      const __m512i wq = join256(lo, hi);
      const __m512i sc = _mm512_permutexvar_epi16(_mm512_load_si512(kFused.q4[c]), s16);
      for (int t = 0; t < T; ++t) {
        isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(wq, vi_load(a[t][i].qs + 64 * c)), sc);
      }
    }
    const __m512 mf = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_shuffle_epi8(vm, load128(kShuffle.repeat2)))),
                                    _mm512_set1_ps(-_cvtsh_ss(w[i].dmin)));
    const float d = _cvtsh_ss(w[i].d);
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_set1_ps(d * a[t][i].d), acc[t]);
      acc[t] = _mm512_fmadd_ps(mf, _mm512_loadu_ps(sums[t][i].s), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
}

template <int T>
void q6k_fused(const BlockQ6_K* w, int64_t nb, const BlockQ8_K* const* a, const KActSums* const* sums, float* out) {
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(0x03);
  for (int64_t i = 0; i < nb; ++i) {
    if (i % 8 == 0) prefetch_range(w + i, 8 * static_cast<int64_t>(sizeof(BlockQ6_K)), kFusedPrefetchBytes);
    const __m128i vs = load128(w[i].scales);
    const __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(vs));
    __m512i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load256(w[i].ql + 64 * h), ql1 = load256(w[i].ql + 64 * h + 32);
      const __m256i qh = load256(w[i].qh + 32 * h);
      auto code = [&](__m256i ql, int ql_shift, int qh_shift) {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, ql_shift), low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, qh_shift), low2);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
      };
      // Chunk 2h holds elements 128h + 0..63, chunk 2h + 1 elements 128h + 64..127.
      const __m512i wq[2] = {join256(code(ql0, 0, 0), code(ql1, 0, 2)), join256(code(ql0, 4, 4), code(ql1, 4, 6))};
      for (int k = 0; k < 2; ++k) {
        const int c = 2 * h + k;
        const __m512i sc = _mm512_permutexvar_epi16(_mm512_load_si512(kFused.q6[c]), s16);
        for (int t = 0; t < T; ++t) {
          isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(wq[k], vi_load(a[t][i].qs + 64 * c)), sc);
        }
      }
    }
    const float d = _cvtsh_ss(w[i].d);
    const __m512 mf = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(vs)), _mm512_set1_ps(-32.0f * d));
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_set1_ps(d * a[t][i].d), acc[t]);
      acc[t] = _mm512_fmadd_ps(mf, _mm512_loadu_ps(sums[t][i].s), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
}

// Q8_0 weights x Q8_0 activations, two 32-element blocks per 512-bit vector: |w| times the
// activations negated where w < 0 (vpdpbusd takes unsigned x signed), then one float scale per
// block: lanes 0-7 carry block 2j, lanes 8-15 block 2j + 1.
template <int T>
void q8_0_fused(const BlockQ8_0* w, int64_t nb, const BlockQ8_0* const* a, float* out) {
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    if (i % 16 == 0) prefetch_range(w + i, 16 * static_cast<int64_t>(sizeof(BlockQ8_0)), kFusedPrefetchBytes);
    const __m512i wv = join256(load256(w[i].qs), load256(w[i + 1].qs));
    const __m512i wabs = _mm512_abs_epi8(wv);
    const __mmask64 neg = _mm512_movepi8_mask(wv);
    const float d0 = _cvtsh_ss(w[i].d), d1 = _cvtsh_ss(w[i + 1].d);
    for (int t = 0; t < T; ++t) {
      const __m512i av = join256(load256(a[t][i].qs), load256(a[t][i + 1].qs));
      const __m512i isum = _mm512_dpbusd_epi32(zero, wabs, _mm512_mask_sub_epi8(av, neg, zero, av));
      const __m512 sc = _mm512_insertf32x8(_mm512_set1_ps(d0 * _cvtsh_ss(a[t][i].d)),
                                           _mm256_set1_ps(d1 * _cvtsh_ss(a[t][i + 1].d)), 1);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    float sum = _mm512_reduce_add_ps(acc[t]);
    if (i < nb) {  // odd block count: the last block on 256-bit vectors
      const __m256i wv = load256(w[i].qs);
      const __m256i isum = dot32_signed(_mm256_abs_epi8(wv), wv, load256(a[t][i].qs));
      sum += hsum256(_mm256_cvtepi32_ps(isum)) * _cvtsh_ss(w[i].d) * _cvtsh_ss(a[t][i].d);
    }
    out[t] = sum;
  }
}

// Rows one at a time, tokens in groups of up to kFusedTokens; t is Q4_K, Q5_K or Q6_K.
constexpr int kFusedTokens = 4;
inline void k_fused_tile(DType t, int64_t nb, const uint8_t* w, size_t w_row_bytes, int64_t r0, int64_t r1,
                         const uint8_t* act, size_t act_row_bytes, const KActSums* sums, int64_t n_tokens, float* y,
                         int64_t y_stride) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * w_row_bytes;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kFusedTokens) {
      const int nt = static_cast<int>(std::min<int64_t>(kFusedTokens, n_tokens - t0));
      const BlockQ8_K* a[kFusedTokens];
      const KActSums* s[kFusedTokens];
      for (int j = 0; j < nt; ++j) {
        a[j] = reinterpret_cast<const BlockQ8_K*>(act + (t0 + j) * act_row_bytes);
        s[j] = sums + (t0 + j) * nb;
      }
      float out[kFusedTokens];
      with_tokens<kFusedTokens>(nt, [&]<int T>() {
        if (t == DType::Q4_K) {
          q45k_fused<T, false>(row, nb, a, s, out);
        } else if (t == DType::Q5_K) {
          q45k_fused<T, true>(row, nb, a, s, out);
        } else {
          q6k_fused<T>(reinterpret_cast<const BlockQ6_K*>(row), nb, a, s, out);
        }
      });
      for (int j = 0; j < nt; ++j) y[(t0 + j) * y_stride + r] = out[j];
    }
  }
}

// Q4_0 weights x Q8_0 activations, two blocks per 512-bit vector as in q8_0_fused; codes - 8 are
// the signed weights.
template <int T>
void q4_0_fused(const BlockQ4_0* w, int64_t nb, const BlockQ8_0* const* a, float* out) {
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  const __m256i low = _mm256_set1_epi8(0x0F);
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    if (i % 16 == 0) prefetch_range(w + i, 16 * static_cast<int64_t>(sizeof(BlockQ4_0)), kFusedPrefetchBytes);
    const __m256i v = _mm256_set_m128i(load128(w[i + 1].qs), load128(w[i].qs));
    // [lo0 lo1 hi0 hi1] in 128-bit lanes -> [lo0 hi0 lo1 hi1]: element order of the two blocks.
    const __m512i q = join256(_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
    const __m512i wv = _mm512_sub_epi8(_mm512_shuffle_i64x2(q, q, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(8));
    const __m512i wabs = _mm512_abs_epi8(wv);
    const __mmask64 neg = _mm512_movepi8_mask(wv);
    const float d0 = _cvtsh_ss(w[i].d), d1 = _cvtsh_ss(w[i + 1].d);
    for (int t = 0; t < T; ++t) {
      const __m512i av = join256(load256(a[t][i].qs), load256(a[t][i + 1].qs));
      const __m512i isum = _mm512_dpbusd_epi32(zero, wabs, _mm512_mask_sub_epi8(av, neg, zero, av));
      const __m512 sc = _mm512_insertf32x8(_mm512_set1_ps(d0 * _cvtsh_ss(a[t][i].d)),
                                           _mm256_set1_ps(d1 * _cvtsh_ss(a[t][i + 1].d)), 1);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, acc[t]);
    }
  }
  LBlock last;
  if (i < nb) unpack_legacy(DType::Q4_0, reinterpret_cast<const uint8_t*>(w + i), 1, &last);
  for (int t = 0; t < T; ++t) {
    float sum = _mm512_reduce_add_ps(acc[t]);
    if (i < nb) {  // odd block count: the last block on 256-bit vectors
      const __m256i isum = dot32_signed(load256(last.u), load256(last.s), load256(a[t][i].qs));
      sum += hsum256(_mm256_cvtepi32_ps(isum)) * last.d * _cvtsh_ss(a[t][i].d);
    }
    out[t] = sum;
  }
}

// t is Q8_0 or Q4_0.
inline void legacy_fused_tile(DType t, int64_t nb, const uint8_t* w, size_t w_row_bytes, int64_t r0, int64_t r1,
                              const uint8_t* act, size_t act_row_bytes, int64_t n_tokens, float* y, int64_t y_stride) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * w_row_bytes;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kFusedTokens) {
      const int nt = static_cast<int>(std::min<int64_t>(kFusedTokens, n_tokens - t0));
      const BlockQ8_0* a[kFusedTokens];
      for (int j = 0; j < nt; ++j) a[j] = reinterpret_cast<const BlockQ8_0*>(act + (t0 + j) * act_row_bytes);
      float out[kFusedTokens];
      with_tokens<kFusedTokens>(nt, [&]<int T>() {
        if (t == DType::Q8_0) {
          q8_0_fused<T>(reinterpret_cast<const BlockQ8_0*>(row), nb, a, out);
        } else {
          q4_0_fused<T>(reinterpret_cast<const BlockQ4_0*>(row), nb, a, out);
        }
      });
      for (int j = 0; j < nt; ++j) y[(t0 + j) * y_stride + r] = out[j];
    }
  }
}

#endif  // DS_SIMD_512
