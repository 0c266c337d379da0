// Host check of tc_attend_frag_t's lane mappings (Q8_0 / Q4_0, head_dim 256): one warp's 16 positions, its
// mma fragments built from the staged codes as the kernel builds them, the P^T shuffles and the output
// columns, against plain sums. Build and run: g++ -std=c++20 -O1 kernels/frag_t_layout.cpp -o /tmp/f && /tmp/f
// (prints ok, exits 1 on a mismatch). Needs _Float16 (g++ 12 or later on x86-64).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
using h16 = _Float16;
constexpr int D = 256, BM = 8;
int frag_q_col(int d) { int p = d & 15, t = p >> 2, j = p & 3; return (d & ~15) + 2 * t + (j & 1) + 8 * (j >> 1); }
struct Pair { h16 lo, hi; };
using M16x16 = float[16][16];
void mma(float C[16][8], const float A[16][16], const float B[16][8]) {
  for (int m = 0; m < 16; ++m) for (int n = 0; n < 8; ++n) { float s = 0; for (int k = 0; k < 16; ++k) s += A[m][k] * B[k][n]; C[m][n] += s; }
}
void A_from(const Pair r[32][4], float A[16][16]) {
  for (int l = 0; l < 32; ++l) { int g = l >> 2, t = l & 3;
    A[g][2*t] = r[l][0].lo; A[g][2*t+1] = r[l][0].hi; A[g+8][2*t] = r[l][1].lo; A[g+8][2*t+1] = r[l][1].hi;
    A[g][2*t+8] = r[l][2].lo; A[g][2*t+9] = r[l][2].hi; A[g+8][2*t+8] = r[l][3].lo; A[g+8][2*t+9] = r[l][3].hi; }
}
void B_from(const Pair b0[32], const Pair b1[32], float B[16][8]) {
  for (int l = 0; l < 32; ++l) { int g = l >> 2, t = l & 3;
    B[2*t][g] = b0[l].lo; B[2*t+1][g] = b0[l].hi; B[2*t+8][g] = b1[l].lo; B[2*t+9][g] = b1[l].hi; }
}
std::mt19937 rng(1);
float rnd() { return std::normal_distribution<float>(0, 1)(rng); }
// one row of blocks; deq = the kernel's f16 elements
void quant(bool q8, const float* x, std::vector<uint8_t>& out, float* deq) {
  for (int b = 0; b < D / 32; ++b) {
    const float* v = x + 32 * b;
    if (q8) {
      float am = 0; for (int i = 0; i < 32; ++i) am = std::fmax(am, std::fabs(v[i]));
      h16 d = (h16)(am / 127); uint8_t db[2]; std::memcpy(db, &d, 2); out.push_back(db[0]); out.push_back(db[1]);
      for (int i = 0; i < 32; ++i) { int q = (int)std::lround(v[i] / (float)d); q = q < -127 ? -127 : q > 127 ? 127 : q; out.push_back((uint8_t)(int8_t)q); deq[32*b+i] = (float)(h16)((float)q * (float)d); }
    } else {
      float am = 0, mx = 0; for (int i = 0; i < 32; ++i) if (std::fabs(v[i]) > am) { am = std::fabs(v[i]); mx = v[i]; }
      h16 d = (h16)(mx / -8); uint8_t db[2]; std::memcpy(db, &d, 2); out.push_back(db[0]); out.push_back(db[1]);
      int q[32]; for (int i = 0; i < 32; ++i) { int c = (int)std::floor(v[i] / (float)d + 8.5f); q[i] = c < 0 ? 0 : c > 15 ? 15 : c; deq[32*b+i] = (float)(h16)((float)(q[i] - 8) * (float)d); }
      for (int i = 0; i < 16; ++i) out.push_back((uint8_t)(q[i] | (q[i + 16] << 4)));
    }
  }
}
uint32_t word(const std::vector<uint8_t>& r, int off) { uint32_t w; std::memcpy(&w, r.data() + off, 4); return w; }
h16 dscale(const std::vector<uint8_t>& r, int off) { h16 d; std::memcpy(&d, r.data() + off, 2); return d; }
void codes(uint32_t u, int bias, h16 d, h16 out[4]) { for (int j = 0; j < 4; ++j) out[j] = (h16)(((float)((u >> (8 * j)) & 0xFF) - bias) * (float)d); }

int run(bool q8) {
  const int BB = q8 ? 34 : 18;
  static float Q[BM][D], K[16][D], V[16][D], Kd[16][D], Vd[16][D];
  static h16 sQ[BM][D];
  for (int r = 0; r < BM; ++r) for (int d = 0; d < D; ++d) { Q[r][d] = (float)(h16)rnd(); sQ[r][frag_q_col(d)] = (h16)Q[r][d]; }
  std::vector<uint8_t> Kb[16], Vb[16];
  for (int i = 0; i < 16; ++i) { for (int d = 0; d < D; ++d) { K[i][d] = rnd(); V[i][d] = rnd(); } quant(q8, K[i], Kb[i], Kd[i]); quant(q8, V[i], Vb[i], Vd[i]); }
  float S[16][8] = {};
  for (int b = 0; b < D / 32; ++b) {
    Pair qb[32][4];
    for (int l = 0; l < 32; ++l) for (int j = 0; j < 4; ++j) { int g = l >> 2, t = l & 3; qb[l][j] = {sQ[g][32*b + 8*j + 2*t], sQ[g][32*b + 8*j + 2*t + 1]}; }
    for (int h = 0; h < 2; ++h) {
      Pair regs[32][4];
      for (int l = 0; l < 32; ++l) { int g = l >> 2, t = l & 3;
        for (int pi = 0; pi < 2; ++pi) { const auto& row = Kb[pi ? g + 8 : g]; h16 d = dscale(row, b * BB); h16 hv[4];
          if (q8) codes(word(row, b*BB + 2 + 16*h + 4*t) ^ 0x80808080u, 128, d, hv); else codes((word(row, b*BB + 2 + 4*t) >> (4*h)) & 0x0F0F0F0Fu, 8, d, hv);
          Pair lo{hv[0], hv[1]}, hi{hv[2], hv[3]};
          if (pi == 0) { regs[l][0] = lo; regs[l][2] = hi; } else { regs[l][1] = lo; regs[l][3] = hi; } } }
      float A[16][16], B[16][8]; A_from(regs, A);
      Pair b0[32], b1[32]; for (int l = 0; l < 32; ++l) { b0[l] = qb[l][2*h]; b1[l] = qb[l][2*h+1]; }
      B_from(b0, b1, B); mma(S, A, B);
    }
  }
  double es = 0, ms = 0;
  for (int p = 0; p < 16; ++p) for (int r = 0; r < 8; ++r) { double s = 0; for (int d = 0; d < D; ++d) s += (double)Kd[p][d] * Q[r][d]; es = std::fmax(es, std::fabs(s - S[p][r])); ms = std::fmax(ms, std::fabs(s)); }
  std::printf("%s S err %.3g of %.3g\n", q8 ? "q8" : "q4", es, ms);
  // P (any values) and its transpose through the shuffles
  float P[16][8]; for (int p = 0; p < 16; ++p) for (int r = 0; r < 8; ++r) P[p][r] = (float)(h16)std::exp2f(0.05f * S[p][r] - 2);
  Pair pe[32], po[32];
  for (int l = 0; l < 32; ++l) { int g = l >> 2, t = l & 3; pe[l] = {(h16)P[g][2*t], (h16)P[g+8][2*t]}; po[l] = {(h16)P[g][2*t+1], (h16)P[g+8][2*t+1]}; }
  Pair b0[32], b1[32];
  for (int l = 0; l < 32; ++l) { int g = l >> 2, t = l & 3, src = 8 * t + g / 2;
    Pair pa = (g & 1) ? po[src] : pe[src], pb = (g & 1) ? po[src + 4] : pe[src + 4];
    b0[l] = {pa.lo, pb.lo}; b1[l] = {pa.hi, pb.hi}; }
  float Bp[16][8]; B_from(b0, b1, Bp);
  int bad = 0; for (int p = 0; p < 16; ++p) for (int r = 0; r < 8; ++r) bad += Bp[p][r] != P[p][r];
  std::printf("P transpose mismatches %d\n", bad);
  static float O[D / 16][16][8]; std::memset(O, 0, sizeof O);
  for (int b = 0; b < D / 32; ++b) {
    Pair lo[32][4], hi[32][4];
    for (int l = 0; l < 32; ++l) { int g = l >> 2, t = l & 3;
      int v_at = 2 + (q8 ? 4 * g : 4 * (g & 3)), sh = q8 ? 0 : 4 * (g >> 2); h16 hv[4][4];
      for (int k = 0; k < 4; ++k) { int pos = 2 * t + (k & 1) + 8 * (k >> 1); const auto& row = Vb[pos]; h16 d = dscale(row, b * BB);
        uint32_t u = word(row, b * BB + v_at); u = q8 ? u ^ 0x80808080u : (u >> sh) & 0x0F0F0F0Fu; codes(u, q8 ? 128 : 8, d, hv[k]); }
      Pair x[4], y[4]; for (int j = 0; j < 4; ++j) { x[j] = {hv[0][j], hv[1][j]}; y[j] = {hv[2][j], hv[3][j]}; }
      lo[l][0] = x[0]; lo[l][1] = x[1]; lo[l][2] = y[0]; lo[l][3] = y[1]; hi[l][0] = x[2]; hi[l][1] = x[3]; hi[l][2] = y[2]; hi[l][3] = y[3]; }
    float A[16][16]; A_from(lo, A); mma(O[2 * b], A, Bp); A_from(hi, A); mma(O[2 * b + 1], A, Bp);
  }
  static float out[BM][D]; for (auto& r : out) for (float& v : r) v = NAN;
  for (int i = 0; i < D / 16; ++i) for (int l = 0; l < 32; ++l) { int g = l >> 2, t = l & 3;
    int dd = q8 ? 4 * g : 16 * (g >> 2) + 4 * (g & 3), d = 32 * (i >> 1) + dd + 2 * (i & 1);
    out[2*t][d] = O[i][g][2*t]; out[2*t+1][d] = O[i][g][2*t+1]; out[2*t][d+1] = O[i][g+8][2*t]; out[2*t+1][d+1] = O[i][g+8][2*t+1]; }
  double eo = 0, mo = 0; int nan = 0;
  for (int r = 0; r < 8; ++r) for (int d = 0; d < D; ++d) { double s = 0; for (int p = 0; p < 16; ++p) s += (double)P[p][r] * Vd[p][d];
    if (std::isnan(out[r][d])) ++nan; else eo = std::fmax(eo, std::fabs(s - out[r][d])); mo = std::fmax(mo, std::fabs(s)); }
  std::printf("%s O err %.3g of %.3g, unwritten %d\n", q8 ? "q8" : "q4", eo, mo, nan);
  return (es > 1e-3 * ms || eo > 1e-3 * mo || nan || bad) ? 1 : 0;
}
int main() { int f = run(true) + run(false); std::printf(f ? "FAIL\n" : "ok\n"); return f; }
