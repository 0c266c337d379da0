// Runs a plain float forward pass (model spec section 4, token by token) over generated tiny models
// and checks that the initialisation keeps every activation finite and of sane size through all
// layers, for both architectures. The forward reads shapes from the GGUF keys and weights from the
// file, so it checks the file as a consumer sees it; it is a test oracle, never optimised.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "testmodel/test_model_writer.h"

namespace ds::testmodel {
namespace {

using Vec = std::vector<float>;

struct Weights {
  const GgufFile* f = nullptr;
  std::map<std::string, Vec> cache;
  const Vec& get(const std::string& name) {
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
    const GgufTensorInfo* t = f->find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    Vec v(t ? static_cast<size_t>(t->n_elements()) : 0);
    if (t) quant::dequantize_rows(t->dtype, t->data, v.data(), t->n_elements() / t->ne[0], t->ne[0]);
    return cache[name] = std::move(v);
  }
};

// y[r] = sum_i W[r * n_in + i] x[i] for a weight with ggml ne = {n_in, n_out} (offset in rows).
Vec matvec(const Vec& w, const Vec& x, int64_t n_out, int64_t row0 = 0) {
  const int64_t n_in = static_cast<int64_t>(x.size());
  Vec y(n_out);
  for (int64_t r = 0; r < n_out; ++r) {
    double s = 0;
    for (int64_t i = 0; i < n_in; ++i) s += static_cast<double>(w[(row0 + r) * n_in + i]) * x[i];
    y[r] = static_cast<float>(s);
  }
  return y;
}

Vec rms_norm(const Vec& x, const float* w, float eps, int64_t off = 0, int64_t n = -1) {
  if (n < 0) n = static_cast<int64_t>(x.size());
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[off + i]) * x[off + i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  Vec y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = x[off + i] * inv * w[i];
  return y;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float silu(float x) { return x * sigmoid(x); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

struct Dims {
  int64_t E, H, Hkv, D, n_rot, dk, nk, nv, K, n_layer, interval, V, n_expert = 0, n_used = 0;
  float eps, base;
};

struct LayerState {
  std::vector<Vec> keys, values;  // full attention: per token [Hkv * D]
  std::vector<Vec> conv;          // delta net: the last K-1 inputs [conv_dim]
  std::vector<Vec> S;             // delta net: per v-head [dk * dk], S[i * dk + j] = S_ij
};

Vec attention(Weights& w, const Dims& d, const std::string& p, const Vec& xn, LayerState& st, int64_t pos) {
  const Vec qg = matvec(w.get(p + "attn_q.weight"), xn, 2 * d.H * d.D);
  Vec k = matvec(w.get(p + "attn_k.weight"), xn, d.Hkv * d.D);
  const Vec v = matvec(w.get(p + "attn_v.weight"), xn, d.Hkv * d.D);
  const float* qn = w.get(p + "attn_q_norm.weight").data();
  const float* kn = w.get(p + "attn_k_norm.weight").data();
  auto rope = [&](float* x) {
    for (int64_t i = 0; i < d.n_rot / 2; ++i) {
      const double theta = pos * std::pow(static_cast<double>(d.base), -2.0 * i / d.n_rot);
      const float c = static_cast<float>(std::cos(theta)), s = static_cast<float>(std::sin(theta));
      const float x0 = x[i], x1 = x[i + d.n_rot / 2];
      x[i] = x0 * c - x1 * s;
      x[i + d.n_rot / 2] = x0 * s + x1 * c;
    }
  };
  for (int64_t h = 0; h < d.Hkv; ++h) {
    Vec kh = rms_norm(k, kn, d.eps, h * d.D, d.D);
    rope(kh.data());
    std::copy(kh.begin(), kh.end(), k.begin() + h * d.D);
  }
  st.keys.push_back(k);
  st.values.push_back(v);
  Vec o(d.H * d.D);
  for (int64_t h = 0; h < d.H; ++h) {
    Vec q = rms_norm(qg, qn, d.eps, h * 2 * d.D, d.D);
    rope(q.data());
    const int64_t g = h / (d.H / d.Hkv);
    std::vector<double> score(st.keys.size());
    for (size_t t = 0; t < st.keys.size(); ++t) {
      double s = 0;
      for (int64_t i = 0; i < d.D; ++i) s += static_cast<double>(q[i]) * st.keys[t][g * d.D + i];
      score[t] = s / std::sqrt(static_cast<double>(d.D));
    }
    const double mx = *std::max_element(score.begin(), score.end());
    double sum = 0;
    for (double& s : score) sum += (s = std::exp(s - mx));
    for (int64_t i = 0; i < d.D; ++i) {
      double acc = 0;
      for (size_t t = 0; t < st.keys.size(); ++t) acc += score[t] / sum * st.values[t][g * d.D + i];
      o[h * d.D + i] = static_cast<float>(acc) * sigmoid(qg[h * 2 * d.D + d.D + i]);
    }
  }
  return matvec(w.get(p + "attn_output.weight"), o, d.E);
}

Vec delta_net(Weights& w, const Dims& d, const std::string& p, const Vec& xn, LayerState& st) {
  const int64_t key_dim = d.dk * d.nk, value_dim = d.dk * d.nv, conv_dim = 2 * key_dim + value_dim;
  const Vec mixed = matvec(w.get(p + "attn_qkv.weight"), xn, conv_dim);
  const Vec z = matvec(w.get(p + "attn_gate.weight"), xn, value_dim);
  const Vec b = matvec(w.get(p + "ssm_beta.weight"), xn, d.nv);
  const Vec a = matvec(w.get(p + "ssm_alpha.weight"), xn, d.nv);
  const Vec& A = w.get(p + "ssm_a");
  const Vec& dt = w.get(p + "ssm_dt.bias");
  const Vec& conv_w = w.get(p + "ssm_conv1d.weight");  // ne {K, conv_dim}
  if (st.conv.empty()) {
    st.conv.assign(d.K - 1, Vec(conv_dim, 0.0f));
    st.S.assign(d.nv, Vec(d.dk * d.dk, 0.0f));
  }
  Vec c(conv_dim);
  for (int64_t ch = 0; ch < conv_dim; ++ch) {
    float s = conv_w[ch * d.K + d.K - 1] * mixed[ch];
    for (int64_t i = 0; i < d.K - 1; ++i) s += conv_w[ch * d.K + i] * st.conv[i][ch];
    c[ch] = silu(s);
  }
  st.conv.erase(st.conv.begin());
  st.conv.push_back(mixed);
  auto l2 = [&](int64_t off) {
    double ss = 0;
    for (int64_t i = 0; i < d.dk; ++i) ss += static_cast<double>(c[off + i]) * c[off + i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss) + d.eps);
    for (int64_t i = 0; i < d.dk; ++i) c[off + i] *= inv;
  };
  for (int64_t h = 0; h < 2 * d.nk; ++h) l2(h * d.dk);
  const float* norm = w.get(p + "ssm_norm.weight").data();
  Vec y(value_dim);
  for (int64_t j = 0; j < d.nv; ++j) {
    const float* q = &c[(j % d.nk) * d.dk];
    const float* k = &c[key_dim + (j % d.nk) * d.dk];
    const float* v = &c[2 * key_dim + j * d.dk];
    const float beta = sigmoid(b[j]);
    const float g = A[j] * softplus(a[j] + dt[j]);
    Vec& S = st.S[j];
    for (float& s : S) s *= std::exp(g);
    for (int64_t col = 0; col < d.dk; ++col) {
      float sk = 0;
      for (int64_t i = 0; i < d.dk; ++i) sk += S[i * d.dk + col] * k[i];
      const float delta = beta * (v[col] - sk);
      for (int64_t i = 0; i < d.dk; ++i) S[i * d.dk + col] += k[i] * delta;
    }
    Vec o(d.dk);
    for (int64_t col = 0; col < d.dk; ++col) {
      float s = 0;
      for (int64_t i = 0; i < d.dk; ++i) s += S[i * d.dk + col] * q[i];
      o[col] = s / std::sqrt(static_cast<float>(d.dk));
    }
    const Vec on = rms_norm(o, norm, d.eps);
    for (int64_t i = 0; i < d.dk; ++i) y[j * d.dk + i] = on[i] * silu(z[j * d.dk + i]);
  }
  return matvec(w.get(p + "ssm_out.weight"), y, d.E);
}

Vec mlp(const Vec& gate_w, const Vec& up_w, const Vec& down_w, const Vec& x, int64_t n_ff, int64_t E,
        int64_t expert = 0) {
  const Vec g = matvec(gate_w, x, n_ff, expert * n_ff);
  const Vec u = matvec(up_w, x, n_ff, expert * n_ff);
  Vec h(n_ff);
  for (int64_t i = 0; i < n_ff; ++i) h[i] = silu(g[i]) * u[i];
  return matvec(down_w, h, E, expert * E);
}

Vec ffn(Weights& w, const Dims& d, const std::string& p, const Vec& x) {
  if (d.n_expert == 0) {
    const int64_t n_ff = static_cast<int64_t>(w.get(p + "ffn_gate.weight").size()) / d.E;
    return mlp(w.get(p + "ffn_gate.weight"), w.get(p + "ffn_up.weight"), w.get(p + "ffn_down.weight"), x, n_ff, d.E);
  }
  const Vec logits = matvec(w.get(p + "ffn_gate_inp.weight"), x, d.n_expert);
  Vec prob(d.n_expert);
  const float mx = *std::max_element(logits.begin(), logits.end());
  float sum = 0;
  for (int64_t e = 0; e < d.n_expert; ++e) sum += (prob[e] = std::exp(logits[e] - mx));
  for (float& p_e : prob) p_e /= sum;
  std::vector<int64_t> order(d.n_expert);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t l, int64_t r) { return prob[l] > prob[r]; });
  float wsum = 0;
  for (int64_t j = 0; j < d.n_used; ++j) wsum += prob[order[j]];
  const int64_t n_ff_exp = static_cast<int64_t>(w.get(p + "ffn_gate_exps.weight").size()) / (d.E * d.n_expert);
  Vec out(d.E, 0.0f);
  for (int64_t j = 0; j < d.n_used; ++j) {
    const Vec y = mlp(w.get(p + "ffn_gate_exps.weight"), w.get(p + "ffn_up_exps.weight"),
                      w.get(p + "ffn_down_exps.weight"), x, n_ff_exp, d.E, order[j]);
    const float wj = prob[order[j]] / std::max(wsum, 6.1e-5f);
    for (int64_t i = 0; i < d.E; ++i) out[i] += wj * y[i];
  }
  const int64_t n_sh = static_cast<int64_t>(w.get(p + "ffn_gate_shexp.weight").size()) / d.E;
  const Vec sh = mlp(w.get(p + "ffn_gate_shexp.weight"), w.get(p + "ffn_up_shexp.weight"),
                     w.get(p + "ffn_down_shexp.weight"), x, n_sh, d.E);
  const float gate = sigmoid(matvec(w.get(p + "ffn_gate_inp_shexp.weight"), x, 1)[0]);
  for (int64_t i = 0; i < d.E; ++i) out[i] += gate * sh[i];
  return out;
}

double rms_of(const Vec& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}

// Runs `tokens` through the model; checks every hidden state and returns the last logits.
Vec run_forward(const GgufFile& f, const std::vector<int64_t>& tokens) {
  const std::string a = *f.get_string("general.architecture");
  auto u = [&](const std::string& k) { return static_cast<int64_t>(*f.get_u32(a + k)); };
  Dims d{u(".embedding_length"), u(".attention.head_count"), u(".attention.head_count_kv"),
         u(".attention.key_length"), u(".rope.dimension_count"), u(".ssm.state_size"), u(".ssm.group_count"),
         u(".ssm.time_step_rank"), u(".ssm.conv_kernel"), u(".block_count"), u(".full_attention_interval"),
         static_cast<int64_t>(f.get_string_array("tokenizer.ggml.tokens")->size())};
  if (f.has(a + ".expert_count")) {
    d.n_expert = u(".expert_count");
    d.n_used = u(".expert_used_count");
  }
  d.eps = *f.get_f32(a + ".attention.layer_norm_rms_epsilon");
  d.base = *f.get_f32(a + ".rope.freq_base");
  Weights w;
  w.f = &f;
  std::vector<LayerState> state(d.n_layer);
  Vec logits;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const Vec& emb = w.get("token_embd.weight");
    Vec x(emb.begin() + tokens[t] * d.E, emb.begin() + (tokens[t] + 1) * d.E);
    for (int64_t il = 0; il < d.n_layer; ++il) {
      const std::string p = "blk." + std::to_string(il) + ".";
      const Vec xn = rms_norm(x, w.get(p + "attn_norm.weight").data(), d.eps);
      const bool recurrent = (il + 1) % d.interval != 0;
      const Vec mix = recurrent ? delta_net(w, d, p, xn, state[il])
                                : attention(w, d, p, xn, state[il], static_cast<int64_t>(t));
      for (int64_t i = 0; i < d.E; ++i) x[i] += mix[i];
      const Vec hn = rms_norm(x, w.get(p + "post_attention_norm.weight").data(), d.eps);
      const Vec y = ffn(w, d, p, hn);
      for (int64_t i = 0; i < d.E; ++i) x[i] += y[i];
      const double r = rms_of(x);
      EXPECT_TRUE(std::isfinite(r)) << "token " << t << " layer " << il;
      EXPECT_GT(r, 0.05) << "token " << t << " layer " << il;
      EXPECT_LT(r, 20.0) << "token " << t << " layer " << il;
    }
    const Vec xn = rms_norm(x, w.get("output_norm.weight").data(), d.eps);
    const std::string out = f.find_tensor("output.weight") ? "output.weight" : "token_embd.weight";
    logits = matvec(w.get(out), xn, d.V);
  }
  return logits;
}

void check_model(TestModelOverrides o) {
  auto c = test_model_config_make("tiny", o);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto bytes = test_model_write_to_memory(*c, {});
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  auto f = GgufFile::from_memory(*bytes);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const Vec l1 = run_forward(**f, {1, 200, 37, 512, 9, 77});
  const Vec l2 = run_forward(**f, {1, 200, 37, 512, 9, 78});
  ASSERT_FALSE(l1.empty());
  const double r = rms_of(l1);
  EXPECT_TRUE(std::isfinite(r));
  EXPECT_GT(r, 0.05) << "logits collapsed";
  EXPECT_LT(r, 50.0) << "logits blew up";
  EXPECT_NE(l1, l2) << "the last token must change the logits";
}

TEST(TestModelForward, DenseActivationsStayFinite) { check_model({}); }

TEST(TestModelForward, MoeActivationsStayFinite) {
  TestModelOverrides o;
  o.arch = TestArch::kQwen35Moe;
  o.type = OutType::kQ8_0;
  check_model(o);
}

TEST(TestModelForward, TiedQ4KMActivationsStayFinite) {
  TestModelOverrides o;
  o.tied_output = true;
  o.type = OutType::kQ4_K_M;
  o.n_layer = 4;
  check_model(o);
}

}  // namespace
}  // namespace ds::testmodel
