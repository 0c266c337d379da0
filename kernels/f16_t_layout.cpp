// Host check of tc_attend_t's lane mappings (F16, head_dim 256): ldmatrix (x4 and x4.trans) addresses, the
// mma fragments, the P^T shuffles and the output columns of each warp, against plain sums. Build and run:
// g++ -std=c++20 -O1 kernels/f16_t_layout.cpp -o /tmp/f && /tmp/f (prints ok, exits 1 on a mismatch).
#include <cmath>
#include <cstdio>
#include <random>
using h16 = _Float16;
constexpr int D = 256, SK = D + 8, PW = 16, KW = 4, BM = 8, kBN = 64;
struct Pair { h16 lo, hi; };
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
void A_from(const Pair r[32][4], float A[16][16]) {
  for (int l = 0; l < 32; ++l) { int g = l >> 2, t = l & 3;
    A[g][2*t] = r[l][0].lo; A[g][2*t+1] = r[l][0].hi; A[g+8][2*t] = r[l][1].lo; A[g+8][2*t+1] = r[l][1].hi;
    A[g][2*t+8] = r[l][2].lo; A[g][2*t+9] = r[l][2].hi; A[g+8][2*t+8] = r[l][3].lo; A[g+8][2*t+9] = r[l][3].hi; }
}
void B_from(const Pair b0[32], const Pair b1[32], float B[16][8]) {
  for (int l = 0; l < 32; ++l) { int g = l >> 2, t = l & 3;
    B[2*t][g] = b0[l].lo; B[2*t+1][g] = b0[l].hi; B[2*t+8][g] = b1[l].lo; B[2*t+9][g] = b1[l].hi; }
}
void mma(float C[16][8], const float A[16][16], const float B[16][8]) {
  for (int m = 0; m < 16; ++m) for (int n = 0; n < 8; ++n) { float s = 0; for (int k = 0; k < 16; ++k) s += A[m][k] * B[k][n]; C[m][n] += s; }
}
// C fragment of lane l: c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).
float cfrag(const float C[16][8], int l, int e) { int g = l >> 2, t = l & 3; return C[g + 8 * (e >> 1)][2 * t + (e & 1)]; }
std::mt19937 rng(1);
float rnd() { return std::normal_distribution<float>(0, 1)(rng); }
int main() {
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
    Pair pe[32], po[32];
    for (int l = 0; l < 32; ++l) { int g = l >> 2, t = l & 3; pe[l] = {(h16)P[g][2*t], (h16)P[g+8][2*t]}; po[l] = {(h16)P[g][2*t+1], (h16)P[g+8][2*t+1]}; }
    Pair b0[32], b1[32];
    for (int l = 0; l < 32; ++l) {
      int g = l >> 2, t = l & 3, src_a = 8 * t + g / 2; bool odd = g & 1;
      Pair ea = pe[src_a], oa = po[src_a], eb = pe[src_a + 4], ob = po[src_a + 4];
      Pair pa = odd ? oa : ea, pb = odd ? ob : eb;
      b0[l] = {pa.lo, pb.lo}; b1[l] = {pa.hi, pb.hi};  // __byte_perm 0x5410: lo halves; 0x7632: hi halves
    }
    float B[16][8]; B_from(b0, b1, B);
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
  std::printf(bad ? "FAIL %d\n" : "ok\n", bad);
  return bad != 0;
}
