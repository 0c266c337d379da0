// Host check of the transposed attention forms' lane mappings (head_dim 256, one warp's 16 positions by 8
// rows), against plain sums: tc_attend_frag_t (Q8_0 / Q4_0: the mma fragments built from the staged codes
// as the kernel builds them) and tc_attend_t (F16: the ldmatrix x4 and x4.trans addresses), each with the
// P^T shuffles of online_softmax_t and the output columns of stage_and_write_t. It checks a copy of the
// kernels' index arithmetic, not the kernels. Build and run (a CMake workbench, or alone):
//   g++ -std=c++20 -O1 kernels/attn_t_layout.cpp -o /tmp/attn_t_layout && /tmp/attn_t_layout
// prints ok, or FAIL and exits 1 on a mismatch. Needs _Float16 (g++ 12 or later on x86-64).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
namespace {
using h16 = _Float16;
struct Pair { h16 lo, hi; };
// m16n8k16: C (16 x 8) += A (16 x 16) B (16 x 8), and the fragments of lane l = 4 g + t.
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
// P (positions x rows) as the C layout of S^T, through online_softmax_t's four shuffles, as P V's B operand.
void pt_as_b(const float P[16][8], float B[16][8]) {
  Pair pe[32], po[32];  // lane (g, t): rows 2t (pe) and 2t + 1 (po) of positions g, g + 8
  for (int l = 0; l < 32; ++l) { int g = l >> 2, t = l & 3; pe[l] = {(h16)P[g][2*t], (h16)P[g+8][2*t]}; po[l] = {(h16)P[g][2*t+1], (h16)P[g+8][2*t+1]}; }
  Pair b0[32], b1[32];
  for (int l = 0; l < 32; ++l) {
    int g = l >> 2, t = l & 3, src_a = 8 * t + g / 2;
    Pair pa = (g & 1) ? po[src_a] : pe[src_a], pb = (g & 1) ? po[src_a + 4] : pe[src_a + 4];
    b0[l] = {pa.lo, pb.lo}; b1[l] = {pa.hi, pb.hi};  // __byte_perm 0x5410: lo halves; 0x7632: hi halves
  }
  B_from(b0, b1, B);
}
std::mt19937 rng(1);
float rnd() { return std::normal_distribution<float>(0, 1)(rng); }

namespace blocks {  // tc_attend_frag_t
constexpr int D = 256, BM = 8;
int frag_q_col(int d) { int p = d & 15, t = p >> 2, j = p & 3; return (d & ~15) + 2 * t + (j & 1) + 8 * (j >> 1); }
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

int run(bool q8) {  // Q8_0 or Q4_0
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
  float Bp[16][8]; pt_as_b(P, Bp);
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
}}  // namespace blocks

namespace f16 {  // tc_attend_t
constexpr int D = 256, SK = D + 8, PW = 16, KW = 4, BM = 8, kBN = 64;
// ldmatrix.x4: lane l gives the address (row r, col c) of row (l % 8) of matrix l / 8; lane l receives of
// matrix i: non-trans (row l/4, cols 2(l%4), +1), trans (rows 2(l%4), +1 at col l/4).
void ldsm(const h16* base, const int addr_row[32], const int addr_col[32], bool trans, Pair out[32][4]) {
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      if (!trans) {
        const int src = 8 * i + l / 4;
        const h16* r = base + addr_row[src] * SK + addr_col[src];
        out[l][i] = {r[2 * (l % 4)], r[2 * (l % 4) + 1]};
      } else {
        const int s0 = 8 * i + 2 * (l % 4), s1 = s0 + 1;
        out[l][i] = {base[addr_row[s0] * SK + addr_col[s0] + l / 4], base[addr_row[s1] * SK + addr_col[s1] + l / 4]};
      }
    }
}
// C fragment of lane l: c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).
float cfrag(const float C[16][8], int l, int e) { int g = l >> 2, t = l & 3; return C[g + 8 * (e >> 1)][2 * t + (e & 1)]; }
int run() {
  static h16 sQ[BM * SK], sK[kBN * SK], sV[kBN * SK];
  for (auto& x : sQ) x = (h16)rnd();
  for (auto& x : sK) x = (h16)rnd();
  for (auto& x : sV) x = (h16)rnd();
  int bad = 0;
  for (int kw = 0; kw < KW; ++kw) {
    int qr[32], qc[32], kr[32], kc[32], vr[32], vc[32];
    for (int lane = 0; lane < 32; ++lane) {
      qr[lane] = lane & 7; qc[lane] = (lane >> 3) * 8;
      kr[lane] = kw * PW + (lane & 15); kc[lane] = (lane >> 4) * 8;
      vr[lane] = kw * PW + (lane & 7) + ((lane >> 4) << 3); vc[lane] = ((lane >> 3) & 1) * 8;
    }
    float S[16][8] = {};
    for (int b = 0; b < D / 32; ++b) {
      int qc2[32], kc2[32];
      Pair qb[32][4];
      for (int l = 0; l < 32; ++l) qc2[l] = qc[l] + 32 * b;
      ldsm(sQ, qr, qc2, false, qb);
      for (int h = 0; h < 2; ++h) {
        Pair a[32][4];
        for (int l = 0; l < 32; ++l) kc2[l] = kc[l] + 32 * b + 16 * h;
        ldsm(sK, kr, kc2, false, a);
        float A[16][16], B[16][8];
        A_from(a, A);
        Pair b0[32], b1[32];
        for (int l = 0; l < 32; ++l) { b0[l] = qb[l][2 * h]; b1[l] = qb[l][2 * h + 1]; }
        B_from(b0, b1, B);
        mma(S, A, B);
      }
    }
    for (int pos = 0; pos < 16; ++pos) for (int r = 0; r < 8; ++r) {
      double ref = 0; for (int d = 0; d < D; ++d) ref += (double)(float)sK[(kw * PW + pos) * SK + d] * (float)sQ[r * SK + d];
      if (std::fabs(ref - S[pos][r]) > 1e-2) { if (bad++ < 5) std::printf("S kw %d pos %d row %d: %f vs %f\n", kw, pos, r, S[pos][r], ref); }
    }
    // P^T: lane (gid, t) holds P at positions gid, gid + 8 for rows 2t, 2t + 1 (as the C layout); the shuffles.
    float P[16][8]; for (auto& r : P) for (auto& x : r) x = (float)(h16)rnd();
    float B[16][8]; pt_as_b(P, B);
    for (int k = 0; k < 16; ++k) for (int n = 0; n < 8; ++n) if (B[k][n] != P[k][n]) { if (bad++ < 5) std::printf("P^T k %d n %d\n", k, n); }
    float Ot[D / 16][16][8] = {};
    for (int i = 0; i < D / 16; ++i) {
      int vc2[32]; for (int l = 0; l < 32; ++l) vc2[l] = vc[l] + 16 * i;
      Pair a[32][4]; ldsm(sV, vr, vc2, true, a);
      float A[16][16]; A_from(a, A);
      mma(Ot[i], A, B);
    }
    // staging: lane's O[i][e] goes to row 2t + (e & 1), dim 16 i + gid + 8 (e >> 1)
    static float out[BM][D];
    for (int l = 0; l < 32; ++l) for (int i = 0; i < D / 16; ++i) for (int e = 0; e < 4; ++e) {
      int g = l >> 2, t = l & 3; out[2 * t + (e & 1)][16 * i + g + 8 * (e >> 1)] = cfrag(Ot[i], l, e);
    }
    for (int r = 0; r < BM; ++r) for (int d = 0; d < D; ++d) {
      double ref = 0; for (int pos = 0; pos < 16; ++pos) ref += (double)(float)(h16)P[pos][r] * (float)sV[(kw * PW + pos) * SK + d];
      if (std::fabs(ref - out[r][d]) > 1e-2) { if (bad++ < 5) std::printf("O kw %d row %d d %d: %f vs %f\n", kw, r, d, out[r][d], ref); }
    }
  }
  std::printf("f16 mismatches %d\n", bad);
  return bad != 0;
}
}  // namespace f16
}  // namespace

int main() {
  const int f = blocks::run(true) + blocks::run(false) + f16::run();
  std::printf(f ? "FAIL\n" : "ok\n");
  return f != 0;
}
