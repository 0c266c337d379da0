// Fast CPU attention. Work is split into tasks of (a block of kQueryBlock query tokens x the query
// heads sharing one KV head) x (a range of KV chunks): each task walks its chunks once with an online
// softmax (running max m, normalizer l, accumulator acc[D] per row), so a K/V chunk is read once for
// the whole GQA group and memory stays bounded however long the context. When there are few query
// rows (decode), the KV range is split too and the partial (m, l, acc) are merged at the end.
// Non-obvious choice: the split depends only on (n_tokens, pos0, shapes), never on the thread count,
// so results are reproducible across runs and thread settings.
#include <algorithm>
#include <cmath>
#include <vector>

#define DS_ATTN_NS base
#include "ops/cpu/attention_kernel.h"
#include "ops/op_impl.h"

namespace ds::ops::cpu {

void attend_block_base(const AttnArgs& a, int64_t t0, int64_t t1, int64_t g, int64_t j0, int64_t j1, float* m,
                       float* l, float* acc, float* scores) {
  base::attend_block(a, t0, t1, g, j0, j1, m, l, acc, scores);
}

namespace {

constexpr int64_t kQueryBlock = 8;   // query tokens per task
constexpr int64_t kMinTasks = 16;    // below this many (query block, KV head) tasks, split the KV range

AttendBlockFn pick_kernel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return attend_block_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return attend_block_avx2;
  return attend_block_base;
}

}  // namespace

void attention(const OpContext& ctx, const TensorView& q, std::span<const TensorView> k_chunks,
               std::span<const TensorView> v_chunks, int64_t n_kv, int64_t pos0, float scale,
               const TensorView& o) {
  static const AttendBlockFn kernel = pick_kernel();
  const int64_t D = q.ne[0], H = q.ne[1], n_tokens = q.ne[2];
  const int64_t Hkv = k_chunks[0].ne[1], C = k_chunks[0].ne[2], group = H / Hkv;
  (void)n_kv;
  const AttnArgs args{q.as<float>(), k_chunks, v_chunks, D, H, Hkv, C, pos0, scale};

  const int64_t n_qblocks = (n_tokens + kQueryBlock - 1) / kQueryBlock;
  const int64_t n_row_tasks = n_qblocks * Hkv;
  const int64_t n_vis_chunks = (pos0 + n_tokens + C - 1) / C;
  int64_t n_split = 1;
  if (n_row_tasks < kMinTasks) n_split = std::min(n_vis_chunks, (kMinTasks + n_row_tasks - 1) / n_row_tasks);
  const int64_t chunks_per_split = (n_vis_chunks + n_split - 1) / n_split;
  n_split = (n_vis_chunks + chunks_per_split - 1) / chunks_per_split;

  // Partials per split, indexed by row (t * H + h): m, l [rows], acc [rows, D].
  const int64_t rows = n_tokens * H;
  std::vector<float> pm(static_cast<size_t>(n_split * rows)), pl(pm.size()), pacc(pm.size() * static_cast<size_t>(D));
  ctx.threads().parallel_for(n_row_tasks * n_split, [&](int64_t i0, int64_t i1, int) {
    const int64_t max_rows = kQueryBlock * group;
    std::vector<float> m(static_cast<size_t>(max_rows)), l(m.size()), acc(m.size() * static_cast<size_t>(D));
    std::vector<float> scores(static_cast<size_t>(C));
    for (int64_t task = i0; task < i1; ++task) {
      const int64_t split = task % n_split, rt = task / n_split;
      const int64_t g = rt % Hkv, qb = rt / Hkv;
      const int64_t t0 = qb * kQueryBlock, t1 = std::min(n_tokens, t0 + kQueryBlock);
      const int64_t j0 = split * chunks_per_split * C, j1 = std::min((split + 1) * chunks_per_split * C, pos0 + n_tokens);
      kernel(args, t0, t1, g, j0, j1, m.data(), l.data(), acc.data(), scores.data());
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t hh = 0; hh < group; ++hh) {
          const int64_t r = (t - t0) * group + hh, row = t * H + g * group + hh;
          pm[split * rows + row] = m[r];
          pl[split * rows + row] = l[r];
          std::copy_n(acc.data() + r * D, D, pacc.data() + (split * rows + row) * D);
        }
      }
    }
  });
  // Merge: o = sum_s e^{m_s - M} acc_s / sum_s e^{m_s - M} l_s, M = max_s m_s.
  float* od = o.as<float>();
  ctx.threads().parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t row = r0; row < r1; ++row) {
      float M = -INFINITY;
      for (int64_t s = 0; s < n_split; ++s) {
        if (pl[s * rows + row] > 0.0f) M = std::max(M, pm[s * rows + row]);
      }
      float L = 0.0f;
      float* out = od + row * D;
      std::fill(out, out + D, 0.0f);
      for (int64_t s = 0; s < n_split; ++s) {
        const float ls = pl[s * rows + row];
        if (!(ls > 0.0f)) continue;
        const float w = std::exp(pm[s * rows + row] - M);
        L += w * ls;
        const float* a = pacc.data() + (s * rows + row) * D;
        for (int64_t d = 0; d < D; ++d) out[d] += w * a[d];
      }
      const float inv = 1.0f / L;
      for (int64_t d = 0; d < D; ++d) out[d] *= inv;
    }
  });
}

}  // namespace ds::ops::cpu
