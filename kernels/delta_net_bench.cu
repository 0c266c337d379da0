// Workbench: gated DeltaNet (ops/delta_net.h) on one layer of the 27B shape (dk = dv = 128, nk = 16,
// nv = 48): prefill of 4096 tokens and decode of one token, checked against a CPU double-precision
// recurrence, then timed (median of N runs, CUDA events); and the model's one-token step (conv, gates,
// norms, recurrence and output norm: the fused step kernel against its two-launch chain), timed only
// (its bits are checked by tests/cuda_delta_net_test.cpp).
// Build (standalone; includes the production kernels):
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Isrc kernels/delta_net_bench.cu \
//     -o build/delta_net_bench
// Run: build/delta_net_bench            (about 10 s on an H100)
// Versions:
//   v1 generic:   one CTA per v-head, one thread per dv column, state in device memory (the old
//                 production kernel; now the fallback for odd shapes).
//   v2 recurrent: CTA per (head, 32 dv columns), state slice in registers, 16-byte state accesses,
//                 cross-row-group reduction by shuffles + shared memory (production decode kernel).
//   v3 chunked:   64-token chunks: prep kernel (T = (I + A)^-1 diag(beta), masked decayed Q K^T, per
//                 chunk and head, all in parallel) + scan kernel (per head and 32 dv columns, chunks in
//                 order, state slice in shared memory, 4 rows x 2 columns per thread), F32 CUDA cores
//                 (production prefill kernel).
// Non-obvious choice: decode runs rotate over enough copies of the state (> 4x the L2 size) that each
// launch reads its state from device memory, as a real decode step of a many-layer model does.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "ops/cuda/delta_net.cu"  // the production kernels and launchers, in this translation unit
#include "workbench.cuh"


namespace {

using ds::cuda::DeltaNetArgs;

cudaStream_t g_stream = nullptr;  // every launch and event (decode batches are graph-captured on it)

constexpr int64_t kDk = 128, kDv = 128, kNk = 16, kNv = 48;
constexpr int64_t kPrefill = 4096;
constexpr int64_t kStateFloats = kNv * kDk * kDv;

struct HostInputs {
  std::vector<float> q, k, v, g, beta, state;
};

HostInputs make_inputs(int64_t n, std::mt19937& rng) {
  HostInputs in;
  in.q.resize(n * kNk * kDk);
  in.k.resize(n * kNk * kDk);
  in.v.resize(n * kNv * kDv);
  in.g.resize(n * kNv);
  in.beta.resize(n * kNv);
  in.state.resize(kStateFloats);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (std::vector<float>* x : {&in.q, &in.k}) {
    for (float& e : *x) e = nd(rng);
    for (int64_t r = 0; r < n * kNk; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < kDk; ++i) ss += double((*x)[r * kDk + i]) * (*x)[r * kDk + i];
      for (int64_t i = 0; i < kDk; ++i) (*x)[r * kDk + i] = float((*x)[r * kDk + i] / std::sqrt(ss + 1e-6));
    }
  }
  for (float& e : in.v) e = 2 * u(rng) - 1;
  for (float& e : in.g) e = -5.f * u(rng);
  for (float& e : in.beta) e = 0.01f + 0.98f * u(rng);
  for (float& e : in.state) e = u(rng) - 0.5f;
  return in;
}

// CPU reference: the spec's recurrence in double.
void reference(const HostInputs& in, int64_t n, std::vector<float>* out, std::vector<float>* state) {
  out->assign(n * kNv * kDv, 0.f);
  std::vector<double> S(in.state.begin(), in.state.end()), kv(kDv);
  const double scale = 1.0 / std::sqrt(double(kDk));
  for (int64_t h = 0; h < kNv; ++h) {
    double* Sh = S.data() + h * kDk * kDv;
    const int64_t hk = h % kNk;
    for (int64_t t = 0; t < n; ++t) {
      const float* qt = &in.q[(t * kNk + hk) * kDk];
      const float* kt = &in.k[(t * kNk + hk) * kDk];
      const float* vt = &in.v[(t * kNv + h) * kDv];
      const double decay = std::exp(double(in.g[t * kNv + h])), bt = in.beta[t * kNv + h];
      for (int64_t i = 0; i < kDk * kDv; ++i) Sh[i] *= decay;
      for (int64_t j = 0; j < kDv; ++j) {
        double a = 0;
        for (int64_t i = 0; i < kDk; ++i) a += Sh[i * kDv + j] * kt[i];
        kv[j] = a;
      }
      for (int64_t i = 0; i < kDk; ++i) {
        for (int64_t j = 0; j < kDv; ++j) Sh[i * kDv + j] += kt[i] * bt * (vt[j] - kv[j]);
      }
      for (int64_t j = 0; j < kDv; ++j) {
        double a = 0;
        for (int64_t i = 0; i < kDk; ++i) a += Sh[i * kDv + j] * qt[i];
        (*out)[(t * kNv + h) * kDv + j] = float(a * scale);
      }
    }
  }
  state->assign(S.begin(), S.end());
}

double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double mx = 0, e = 0;
  for (size_t i = 0; i < ref.size(); ++i) mx = std::max(mx, double(std::fabs(ref[i])));
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    e = std::max(e, std::fabs(double(got[i]) - ref[i]));
  }
  return e / (mx > 0 ? mx : 1);
}

struct DeviceInputs {
  float *q, *k, *v, *g, *beta, *state, *out, *scratch;
  int64_t n;
  DeltaNetArgs args() const { return DeltaNetArgs{q, k, v, g, beta, state, out, kDk, kNk, kDv, kNv, n}; }
};

float* upload(const std::vector<float>& h) {
  float* d = nullptr;
  CK(cudaMalloc(&d, h.size() * 4));
  CK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

DeviceInputs to_device(const HostInputs& in, int64_t n) {
  DeviceInputs d{upload(in.q), upload(in.k), upload(in.v), upload(in.g), upload(in.beta), upload(in.state),
                 nullptr, nullptr, n};
  CK(cudaMalloc(&d.out, n * kNv * kDv * 4));
  CK(cudaMalloc(&d.scratch, ds::cuda::delta_net_chunked_scratch_bytes(d.args())));
  return d;
}

void free_device(DeviceInputs& d) {
  for (float* p : {d.q, d.k, d.v, d.g, d.beta, d.state, d.out, d.scratch}) CK(cudaFree(p));
}

enum class Version { kGeneric, kRecurrent, kChunked };
const char* version_name(Version v) {
  return v == Version::kGeneric ? "v1 generic" : v == Version::kRecurrent ? "v2 recurrent" : "v3 chunked";
}

void launch(Version ver, const DeltaNetArgs& a, float* scratch) {
  if (ver == Version::kChunked) {
    CK(ds::cuda::delta_net_chunked_launch(a, scratch, g_stream));
  } else if (ver == Version::kRecurrent) {
    CK(ds::cuda::delta_net_recurrent_launch(a, g_stream));
  } else {
    const int threads = int(std::min<int64_t>(1024, (a.dv + 31) / 32 * 32));
    ds::cuda::dn_generic_kernel<<<unsigned(a.nv), threads, 2 * a.dk * sizeof(float), g_stream>>>(
        a.q, a.k, a.v, a.g, a.beta, a.state, a.out, a.dk, a.nk, a.dv, a.nv, a.n_tokens, a.dv, a.nv * a.dv);
    CK(cudaGetLastError());
  }
}


void check(std::mt19937& rng) {
  for (int64_t n : {int64_t{1}, int64_t{130}}) {
    const HostInputs in = make_inputs(n, rng);
    std::vector<float> ref_out, ref_state;
    reference(in, n, &ref_out, &ref_state);
    for (Version ver : {Version::kGeneric, Version::kRecurrent, Version::kChunked}) {
      DeviceInputs d = to_device(in, n);
      launch(ver, d.args(), d.scratch);
      CK(cudaStreamSynchronize(g_stream));
      std::vector<float> out(ref_out.size()), state(kStateFloats);
      CK(cudaMemcpy(out.data(), d.out, out.size() * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(state.data(), d.state, state.size() * 4, cudaMemcpyDeviceToHost));
      const double eo = rel_err(out, ref_out), es = rel_err(state, ref_state);
      std::printf("check n=%-4lld %-13s out %.2e  state %.2e  %s\n", (long long)n, version_name(ver), eo, es,
                  eo < 1e-4 && es < 1e-4 ? "ok" : "FAIL");
      free_device(d);
    }
  }
}

void bench_prefill(std::mt19937& rng) {
  const HostInputs in = make_inputs(kPrefill, rng);
  DeviceInputs d = to_device(in, kPrefill);
  const DeltaNetArgs a = d.args();
  const double flops_chunk =  // per (chunk, head): prep K K^T + Q K^T (full tiles) + scan products
      2.0 * (2 * 64 * 64 * kDk) + 2.0 * (2 * 64 * kDk * kDv + 2 * 64 * 64 * kDv + kDk * 64 * kDv);
  const double flops = flops_chunk * (kPrefill / 64) * kNv;
  for (Version ver : {Version::kChunked, Version::kRecurrent, Version::kGeneric}) {
    const int runs = ver == Version::kChunked ? 11 : 3;
    const float ms = median_event_ms(g_stream, runs, [&](int) { launch(ver, a, d.scratch); });
    std::printf("prefill n=%lld %-13s %9.1f us  %8.0f tok/s/layer  (48 layers: %7.1f ms)", (long long)kPrefill,
                version_name(ver), ms * 1e3, kPrefill / (ms * 1e-3), 48 * ms);
    if (ver == Version::kChunked) std::printf("  %.1f TFLOP/s (F32 peak ~67)", flops / (ms * 1e-3) / 1e12);
    std::printf("\n");
  }
  // The two chunked kernels of one window (1024 tokens) separately.
  DeltaNetArgs w = a;
  w.n_tokens = ds::cuda::kDeltaNetWindowTokens;
  const unsigned n_chunks = unsigned(w.n_tokens / 64);
  const size_t prep_smem = sizeof(float) * ds::cuda::PrepSmem<kDk>::kFloats;
  const size_t scan_smem = sizeof(float) * ds::cuda::ScanSmem<kDk>::kFloats;
  launch(Version::kChunked, w, d.scratch);  // sets the smem attributes
  const float prep_ms = median_event_ms(g_stream, 11, [&](int) {
    ds::cuda::dn_prep_kernel<kDk><<<dim3(n_chunks, kNv), ds::cuda::kPrepThreads, prep_smem, g_stream>>>(
        w.q, w.k, w.g, w.beta, d.scratch, kNk, kNv, int(w.n_tokens), 1.f / std::sqrt(float(kDk)));
  });
  const float scan_ms = median_event_ms(g_stream, 11, [&](int) {
    ds::cuda::dn_scan_kernel<kDk><<<dim3(kDv / 32, kNv), ds::cuda::kScanThreads, scan_smem, g_stream>>>(
        w.q, w.k, w.v, d.scratch, w.state, w.out, kNk, kNv, kDv, int(w.n_tokens), 1.f / std::sqrt(float(kDk)),
        int64_t{kDv}, int64_t{kNv} * kDv);
  });
  CK(cudaGetLastError());
  std::printf("  one window of %lld tokens: prep %.1f us (%u x %lld CTAs, %zu B smem), scan %.1f us (%lld CTAs, %zu B smem)\n",
              (long long)w.n_tokens, prep_ms * 1e3, n_chunks, (long long)kNv, prep_smem, scan_ms * 1e3,
              (long long)(kDv / 32 * kNv), scan_smem);
  // Where the chunked form starts to pay: n tokens through each form.
  for (int64_t n : {int64_t{4}, int64_t{16}, int64_t{32}, int64_t{64}, int64_t{256}}) {
    DeltaNetArgs s = a;
    s.n_tokens = n;
    const float rec = median_event_ms(g_stream, 21, [&](int) { launch(Version::kRecurrent, s, d.scratch); });
    const float chk = median_event_ms(g_stream, 21, [&](int) { launch(Version::kChunked, s, d.scratch); });
    std::printf("  n=%-4lld recurrent %8.1f us   chunked %8.1f us\n", (long long)n, rec * 1e3, chk * 1e3);
  }
  free_device(d);
}

// Enough copies of a layer's state (*n_copies, more than 4x the L2 together) that each launch of a decode
// graph reads its own from device memory; each a copy of `init` (device memory), or zeros.
float* state_copies(const float* init, int* n_copies) {
  int dev = 0, l2 = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const int64_t state_bytes = kStateFloats * 4;
  *n_copies = int(std::max<int64_t>(2, 4 * int64_t(l2) / state_bytes + 1));
  float* states = nullptr;
  CK(cudaMalloc(&states, *n_copies * state_bytes));
  CK(cudaMemset(states, 0, *n_copies * state_bytes));
  for (int c = 0; init != nullptr && c < *n_copies; ++c) {
    CK(cudaMemcpy(states + c * kStateFloats, init, state_bytes, cudaMemcpyDeviceToDevice));
  }
  return states;
}

void bench_decode(std::mt19937& rng) {
  const HostInputs in = make_inputs(1, rng);
  DeviceInputs d = to_device(in, 1);
  const int64_t state_bytes = kStateFloats * 4;
  int copies = 0;
  float* states = state_copies(d.state, &copies);
  for (Version ver : {Version::kRecurrent, Version::kGeneric}) {
    // One layer per state copy, captured once as a graph (as the model's decode step will be).
    const float ms = graph_median_ms(
        g_stream,
        [&] {
          for (int c = 0; c < copies; ++c) {
            DeltaNetArgs a = d.args();
            a.state = states + c * kStateFloats;
            launch(ver, a, d.scratch);
          }
        },
        9);
    const double us = ms * 1e3 / copies;
    std::printf("decode n=1 %-13s %7.2f us/layer  %7.0f GB/s state read+write (graph of %d layers, %.1f MB state each)\n",
                version_name(ver), us, 2.0 * state_bytes / (us * 1e-6) / 1e9, copies, state_bytes / 1e6);
  }
  CK(cudaFree(states));
  free_device(d);
}

// One token's whole DeltaNet core as the model runs it: delta_net_step_q8_launch (conv with the carried
// inputs, gates, q/k norms, the recurrence and the gated output norm with its q8 codes; clusters of the
// nv / nk v-heads that share a q/k head) against its two-launch chain (delta_net_prep_launch, then
// delta_net_norm_q8_launch). Each launch of the graph takes its own state copy.
void bench_decode_step(std::mt19937& rng) {
  constexpr int kKernel = 4;
  const int64_t n_ch = 2 * kNk * kDk + kNv * kDv;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  auto host = [&](int64_t n, float lo, float hi) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = lo + (hi - lo) * u(rng);
    return x;
  };
  std::vector<float> mixed(static_cast<size_t>(n_ch)), z(static_cast<size_t>(kNv * kDv));
  for (float& e : mixed) e = nd(rng);
  for (float& e : z) e = nd(rng);
  float* d_mixed = upload(mixed);
  float* d_conv_w = upload(host(n_ch * kKernel, -0.5f, 0.5f));
  float* d_conv_state = upload(host((kKernel - 1) * n_ch, -1.f, 1.f));
  float* d_alpha = upload(host(kNv, -1.f, 1.f));
  float* d_b = upload(host(kNv, -1.f, 1.f));
  float* d_dt_bias = upload(host(kNv, -0.1f, 0.1f));
  float* d_ssm_a = upload(host(kNv, -1.5f, -0.5f));
  float* d_w = upload(std::vector<float>(kDv, 1.0f));
  float* d_z = upload(z);
  float *d_conv, *d_q, *d_k, *d_g, *d_beta, *d_out, *d_y;
  int8_t* d_act;
  CK(cudaMalloc(&d_conv, 4 * n_ch));
  CK(cudaMalloc(&d_q, 4 * kNk * kDk));
  CK(cudaMalloc(&d_k, 4 * kNk * kDk));
  CK(cudaMalloc(&d_g, 4 * kNv));
  CK(cudaMalloc(&d_beta, 4 * kNv));
  CK(cudaMalloc(&d_out, 4 * kNv * kDv));
  CK(cudaMalloc(&d_y, 4 * kNv * kDv));
  CK(cudaMalloc(&d_act, ds::cuda::kern::q8_act_bytes(kDv, kNv)));
  const ds::cuda::DeltaNetPrepArgs p{d_mixed, d_conv_w, d_conv_state, d_conv, d_q,   d_k,  d_alpha,  d_b, d_dt_bias,
                                     d_ssm_a, d_g,      d_beta,       n_ch,   kDk,   kNk,  kNv,      kKernel, 1e-6f};
  ds::cuda::DeltaNetNormQ8 nq;
  nq.w = d_w;
  nq.z = d_z;
  nq.eps = 1e-6f;
  nq.y = d_y;
  nq.q8 = d_act;
  nq.q8_ds = reinterpret_cast<float2*>(d_act + ds::cuda::kern::q8_ds_offset(kDv, kNv));
  const int64_t state_bytes = kStateFloats * 4;
  int copies = 0;
  float* states = state_copies(nullptr, &copies);
  auto args_for = [&](int c) {
    return DeltaNetArgs{d_q, d_k, d_conv + 2 * kNk * kDk, d_g, d_beta, states + c * kStateFloats, d_out,
                        kDk, kNk, kDv, kNv, 1, kDv, n_ch};
  };
  if (!ds::cuda::delta_net_step_q8_fits(p, args_for(0))) {
    std::printf("decode step: not on this device (no thread-block clusters)\n");
  } else {
    for (const bool fused : {false, true}) {
      const float ms = graph_median_ms(
          g_stream,
          [&] {
            for (int c = 0; c < copies; ++c) {
              if (fused) {
                CK(ds::cuda::delta_net_step_q8_launch(p, args_for(c), nq, g_stream));
              } else {
                CK(ds::cuda::delta_net_prep_launch(p, g_stream));
                CK(ds::cuda::delta_net_norm_q8_launch(args_for(c), nq, g_stream));
              }
            }
          },
          9);
      const double us = ms * 1e3 / copies;
      std::printf("decode step %-28s %7.2f us/layer  %7.0f GB/s state read+write (graph of %d layers)\n",
                  fused ? "delta_net_step_q8" : "prep + norm_q8 (two launches)", us,
                  2.0 * state_bytes / (us * 1e-6) / 1e9, copies);
    }
  }
  for (void* ptr : {static_cast<void*>(d_mixed), static_cast<void*>(d_conv_w), static_cast<void*>(d_conv_state),
                    static_cast<void*>(d_alpha), static_cast<void*>(d_b), static_cast<void*>(d_dt_bias),
                    static_cast<void*>(d_ssm_a), static_cast<void*>(d_w), static_cast<void*>(d_z),
                    static_cast<void*>(d_conv), static_cast<void*>(d_q), static_cast<void*>(d_k),
                    static_cast<void*>(d_g), static_cast<void*>(d_beta), static_cast<void*>(d_out),
                    static_cast<void*>(d_y), static_cast<void*>(d_act), static_cast<void*>(states)}) {
    CK(cudaFree(ptr));
  }
}

}  // namespace

int main() {
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, 0));
  std::printf("device %s, %d SMs; 27B DeltaNet layer: dk=dv=%lld nk=%lld nv=%lld\n", p.name, p.multiProcessorCount,
              (long long)kDk, (long long)kNk, (long long)kNv);
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  std::mt19937 rng(42);
  check(rng);
  bench_prefill(rng);
  bench_decode(rng);
  bench_decode_step(rng);
  CK(cudaStreamDestroy(g_stream));
  return 0;
}
