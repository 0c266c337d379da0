// Sequence state streams: serialize -> deserialize -> continue equals an uninterrupted run
// (bit-exact at a prefill-chunk boundary), save -> load -> save is byte-identical, fork, KV-only
// streams, and rejection of corrupted, truncated and foreign streams.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "model_test_util.h"
#include "ops/device_buffer.h"
#include "state/state_io.h"

namespace ds {
namespace {

ModelOptions opts() {
  ModelOptions o;
  o.prefill_chunk = 16;
  o.kv_chunk_tokens = 8;
  return o;
}

std::vector<float> logits_of(const Model& m, const SequenceState& st) {
  auto l = m.logits(st);
  return {l.begin(), l.end()};
}

class StateIo : public ::testing::TestWithParam<bool> {};

TEST_P(StateIo, RestoreThenContinueIsBitExact) {
  auto m = test::load_tiny(GetParam(), opts());
  const auto toks = test::tokens(45);
  auto full = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*full, toks).is_ok());

  auto part = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*part, std::span<const int32_t>(toks.data(), 32)).is_ok());
  auto bytes = std::move(m->save_state(*part, 32)).value();
  part.reset();
  auto restored_r = m->load_state(bytes);
  ASSERT_TRUE(restored_r.is_ok()) << restored_r.status().to_string();
  auto restored = std::move(restored_r).value();
  EXPECT_EQ(restored->pos(), 32);
  ASSERT_TRUE(m->prefill(*restored, std::span<const int32_t>(toks.data() + 32, 13)).is_ok());
  EXPECT_EQ(logits_of(*m, *restored), logits_of(*m, *full));
  // Decoding on from both gives identical logits too.
  ASSERT_TRUE(m->decode(*restored, 5).is_ok());
  ASSERT_TRUE(m->decode(*full, 5).is_ok());
  EXPECT_EQ(logits_of(*m, *restored), logits_of(*m, *full));
}

TEST_P(StateIo, SaveLoadSaveIsByteIdentical) {
  auto m = test::load_tiny(GetParam(), opts());
  auto st = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, test::tokens(21)).is_ok());
  auto a = std::move(m->save_state(*st, 21)).value();
  auto st2 = std::move(m->load_state(a)).value();
  auto b = std::move(m->save_state(*st2, 21)).value();
  EXPECT_EQ(a, b);
  EXPECT_EQ(logits_of(*m, *st2), logits_of(*m, *st));
}

TEST_P(StateIo, ForkIsIndependent) {
  auto m = test::load_tiny(GetParam(), opts());
  auto st = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, test::tokens(19)).is_ok());
  auto fork = std::move(st->fork()).value();
  ASSERT_TRUE(m->decode(*st, 7).is_ok());
  ASSERT_TRUE(m->decode(*fork, 7).is_ok());
  EXPECT_EQ(logits_of(*m, *fork), logits_of(*m, *st));
  ASSERT_TRUE(m->decode(*st, 8).is_ok());
  ASSERT_TRUE(m->decode(*fork, 9).is_ok());
  EXPECT_NE(logits_of(*m, *fork), logits_of(*m, *st));
}

TEST_P(StateIo, KvOnlyStreamCannotContinue) {
  auto m = test::load_tiny(GetParam(), opts());
  auto st = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, test::tokens(20)).is_ok());
  auto bytes = std::move(m->save_state(*st, 12)).value();
  auto kv = std::move(m->load_state(bytes)).value();
  EXPECT_EQ(kv->pos(), 12);
  EXPECT_FALSE(kv->has_recurrent());
  EXPECT_EQ(m->decode(*kv, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->save_state(*st, 21).status().code(), StatusCode::kInvalidArgument);
  // The KV prefix in the stream equals the live state's.
  for (int64_t c = 0; c < 2; ++c) {
    for (int64_t i = 0; i < 2; ++i) {  // two attention layers
      const TensorView a = st->k_chunk(i, c), b = kv->k_chunk(i, c);
      const int64_t n = (c == 0 ? 8 : 4) * a.ne[0] * a.ne[1];
      EXPECT_EQ(0, std::memcmp(a.data, b.data, static_cast<size_t>(n) * 4));
    }
  }
}

// A delta (KV of [f, b) and the state at b) on top of the state at f continues exactly as the whole
// stream does, and a chain joins into the whole stream byte for byte; whole streams stay version 1.
TEST_P(StateIo, DeltaStreamsContinueAndJoinIntoTheWholeStream) {
  auto m = test::load_tiny(GetParam(), opts());
  const auto toks = test::tokens(45);
  auto st = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, std::span<const int32_t>(toks.data(), 11)).is_ok());
  const auto s0 = std::move(m->save_state(*st, 11)).value();  // f = 11: inside the second KV chunk of 8
  ASSERT_TRUE(m->prefill(*st, std::span<const int32_t>(toks.data() + 11, 16)).is_ok());
  const auto d1 = std::move(state_serialize(*st, 27, 0, -1, 11)).value();
  ASSERT_TRUE(m->prefill(*st, std::span<const int32_t>(toks.data() + 27, 5)).is_ok());
  const auto d2 = std::move(state_serialize(*st, 32, 0, -1, 27)).value();
  const auto whole = std::move(m->save_state(*st, 32)).value();
  EXPECT_EQ(s0[4], 1);  // write version 1: what earlier builds read
  EXPECT_EQ(d1[4], 2);
  EXPECT_EQ(d1[6], 2);  // earlier readers refuse it
  EXPECT_LT(d1.size(), whole.size());

  // Join: byte-identical to the whole stream.
  const std::vector<std::span<const uint8_t>> chain = {s0, d1, d2};
  auto joined = state_stream_join(chain, m->kv_pool()->layout());
  ASSERT_TRUE(joined.is_ok()) << joined.status().to_string();
  EXPECT_EQ(*joined, whole);
  auto one = state_stream_join(std::vector<std::span<const uint8_t>>{s0}, m->kv_pool()->layout());
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(*one, s0);

  // Restore: the links' KV, the last one's recurrent state; then on as the original.
  auto r = std::move(m->new_state()).value();
  ASSERT_TRUE(m->load_state_into(s0, *r, false).is_ok());
  EXPECT_FALSE(r->has_recurrent());
  EXPECT_FALSE(r->logits_valid());
  ASSERT_TRUE(m->load_state_into(d1, *r, false).is_ok());
  EXPECT_EQ(r->pos(), 27);
  ASSERT_TRUE(m->load_state_into(d2, *r).is_ok());
  EXPECT_EQ(r->pos(), 32);
  EXPECT_TRUE(r->has_recurrent());
  EXPECT_EQ(logits_of(*m, *r), logits_of(*m, *st));
  EXPECT_EQ(*m->save_state(*r, 32), whole);
  ASSERT_TRUE(m->prefill(*r, std::span<const int32_t>(toks.data() + 32, 13)).is_ok());
  ASSERT_TRUE(m->prefill(*st, std::span<const int32_t>(toks.data() + 32, 13)).is_ok());
  EXPECT_EQ(logits_of(*m, *r), logits_of(*m, *st));

  // A delta only goes on top of the state it continues.
  auto fresh = std::move(m->new_state()).value();
  EXPECT_EQ(m->load_state_into(d1, *fresh).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->load_state(d1).status().code(), StatusCode::kInvalidArgument);
  auto at11 = std::move(m->load_state(s0)).value();
  EXPECT_EQ(m->load_state_into(d2, *at11).code(), StatusCode::kInvalidArgument);
  // Chains with a gap, out of order, or not starting at token 0 do not join.
  const auto layout = m->kv_pool()->layout();
  EXPECT_EQ(state_stream_join(std::vector<std::span<const uint8_t>>{s0, d2}, layout).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(state_stream_join(std::vector<std::span<const uint8_t>>{d1, d2}, layout).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(state_stream_join(std::vector<std::span<const uint8_t>>{}, layout).status().code(),
            StatusCode::kInvalidArgument);
  // Bad arguments, and a corrupted delta.
  EXPECT_EQ(state_serialize(*st, 45, 0, -1, 50).status().code(), StatusCode::kInvalidArgument);
  auto bad = d1;
  bad[bad.size() / 2] ^= 0x10;
  EXPECT_EQ(state_stream_join(std::vector<std::span<const uint8_t>>{s0, bad}, layout).status().code(),
            StatusCode::kCorrupt);
}

TEST_P(StateIo, CorruptTruncatedAndForeignStreamsAreRejected) {
  auto m = test::load_tiny(GetParam(), opts());
  auto st = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, test::tokens(10)).is_ok());
  const auto good = std::move(m->save_state(*st, 10)).value();
  ASSERT_TRUE(m->load_state(good).is_ok());
  // A flipped byte anywhere (header, section headers, payloads) is caught.
  for (size_t off : {size_t{0}, size_t{9}, size_t{20}, size_t{60}, size_t{70}, good.size() / 2, good.size() - 1}) {
    auto bad = good;
    bad[off] ^= 0x10;
    auto r = m->load_state(bad);
    EXPECT_FALSE(r.is_ok()) << "flip at " << off;
  }
  for (size_t len : {size_t{0}, size_t{63}, size_t{100}, good.size() - 1}) {
    auto r = m->load_state(std::span<const uint8_t>(good.data(), len));
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << "truncated to " << len;
  }
  auto longer = good;
  longer.push_back(0);
  EXPECT_EQ(m->load_state(longer).status().code(), StatusCode::kCorrupt);
  // Another model (different weights) refuses the stream, naming the fingerprint.
  auto other = test::load_tiny(GetParam(), opts(), /*seed=*/8);
  auto r = other->load_state(good);
  EXPECT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("another model"), std::string::npos) << r.status().message();
}

TEST_P(StateIo, EveryFlippedByteIsRejected) {
  // Each section header and payload is checksummed, so no single-byte change may load.
  ModelOptions o = opts();
  auto m = test::load_tiny(GetParam(), o);
  auto st = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, test::tokens(3)).is_ok());
  const auto good = std::move(m->save_state(*st, 3)).value();
  size_t accepted = 0;
  for (size_t off = 0; off < good.size(); off += 5) {
    auto bad = good;
    bad[off] ^= 0x01;
    accepted += m->load_state(bad).is_ok() ? 1 : 0;
  }
  EXPECT_EQ(accepted, 0u);
}

TEST_P(StateIo, LayerRangeStreamsRecombine) {
  // A split state exported per shard ([0, 3) and [3, 6)) and imported back equals the original.
  auto m = test::load_tiny(GetParam(), opts());
  auto st = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, test::tokens(20)).is_ok());
  auto lo = std::move(m->save_state(*st, 20, LayerRange{0, 3})).value();
  auto hi = std::move(m->save_state(*st, 20, LayerRange{3, 6})).value();
  EXPECT_EQ(std::move(m->save_state(*st, 20, LayerRange{0, 6})).value(), std::move(m->save_state(*st, 20)).value());
  auto joined = std::move(m->new_state()).value();
  ASSERT_TRUE(m->load_state_into(hi, *joined).is_ok());
  ASSERT_TRUE(m->load_state_into(lo, *joined).is_ok());
  EXPECT_EQ(std::move(m->save_state(*joined, 20)).value(), std::move(m->save_state(*st, 20)).value());
  ASSERT_TRUE(m->decode(*joined, 4).is_ok());
  ASSERT_TRUE(m->decode(*st, 4).is_ok());
  EXPECT_EQ(logits_of(*m, *joined), logits_of(*m, *st));
  // A stream at another position does not merge; bad ranges are refused.
  auto other = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*other, test::tokens(5)).is_ok());
  EXPECT_EQ(m->load_state_into(lo, *other).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->save_state(*st, 21, LayerRange{4, 2}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->save_state(*st, 21, LayerRange{0, 7}).status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Arch, StateIo, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "qwen35moe" : "qwen35"; });

TEST(StateIoF16, HalfKvCacheRestoresBitExactAndStaysCloseToF32) {
  ModelOptions half = opts();
  half.kv_dtype = DType::F16;
  auto m = test::load_tiny(true, half);
  auto m32 = test::load_tiny(true, opts());
  const auto toks = test::tokens(40);
  auto full = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*full, toks).is_ok());
  auto part = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*part, std::span<const int32_t>(toks.data(), 16)).is_ok());
  auto bytes = std::move(m->save_state(*part, 16)).value();
  auto restored = std::move(m->load_state(bytes)).value();
  ASSERT_TRUE(m->prefill(*restored, std::span<const int32_t>(toks.data() + 16, 24)).is_ok());
  EXPECT_EQ(logits_of(*m, *restored), logits_of(*m, *full));
  // Half the KV bytes of the F32 layout; a stream of one layout does not load into the other.
  EXPECT_EQ(m->state_layout().kv_slot_bytes() * 2, m32->state_layout().kv_slot_bytes());
  EXPECT_FALSE(m32->load_state(bytes).is_ok());
  auto st32 = std::move(m32->new_state()).value();
  ASSERT_TRUE(m32->prefill(*st32, toks).is_ok());
  const auto a = logits_of(*m, *full), b = logits_of(*m32, *st32);
  double err = 0;
  for (size_t i = 0; i < a.size(); ++i) err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
  EXPECT_LT(err, 1e-2);
  EXPECT_GT(err, 0.0);  // the cache really is F16
}

// A block-quantized KV cache (Q8_0, Q4_0; head_dim 32: one block per head row): a restored state
// continues exactly as the state it was saved from, a stream cut inside a chunk carries whole position
// rows, and its layout is apart from the F16, F32 and other block type's (fingerprint, slot bytes); the
// logits stay near the F32 cache's.
class StateIoQuantKv : public ::testing::TestWithParam<DType> {};

TEST_P(StateIoQuantKv, RestoresBitExactAndStaysCloseToF32) {
  constexpr int64_t kHeadDim = 32;
  const DType dt = GetParam(), other = dt == DType::Q8_0 ? DType::Q4_0 : DType::Q8_0;
  // Max |logit difference| against the F32 cache; it grows with a block's rounding step, amax / 8 for
  // Q4_0 against amax / 127 for Q8_0: measured 2e-3 for Q8_0, 3e-2 for Q4_0 (F16: 4e-5).
  const double tol_f32 = dt == DType::Q4_0 ? 1.5e-1 : 1e-2;
  ModelOptions kq = opts(), ko = opts(), f16 = opts();
  kq.kv_dtype = dt;
  ko.kv_dtype = other;
  f16.kv_dtype = DType::F16;
  auto m = test::load_tiny(true, kq, 7, kHeadDim);
  auto mo = test::load_tiny(true, ko, 7, kHeadDim);
  auto m16 = test::load_tiny(true, f16, 7, kHeadDim);
  auto m32 = test::load_tiny(true, opts(), 7, kHeadDim);
  ASSERT_TRUE(m && mo && m16 && m32);
  const auto toks = test::tokens(40);
  // Saved at 21 (inside the third KV chunk of 8), restored, and both run on alike.
  auto st = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, std::span<const int32_t>(toks.data(), 21)).is_ok());
  const auto bytes = std::move(m->save_state(*st, 21)).value();
  auto restored_r = m->load_state(bytes);
  ASSERT_TRUE(restored_r.is_ok()) << restored_r.status().to_string();
  auto restored = std::move(restored_r).value();
  EXPECT_EQ(*m->save_state(*restored, 21), bytes);
  EXPECT_EQ(logits_of(*m, *restored), logits_of(*m, *st));
  ASSERT_TRUE(m->prefill(*restored, std::span<const int32_t>(toks.data() + 21, 19)).is_ok());
  ASSERT_TRUE(m->prefill(*st, std::span<const int32_t>(toks.data() + 21, 19)).is_ok());
  EXPECT_EQ(logits_of(*m, *restored), logits_of(*m, *st));
  ASSERT_TRUE(m->decode(*restored, 5).is_ok());
  ASSERT_TRUE(m->decode(*st, 5).is_ok());
  EXPECT_EQ(logits_of(*m, *restored), logits_of(*m, *st));

  // A KV-only stream cut at 13 holds the first 13 position rows byte for byte.
  const StateLayout& l = m->state_layout();
  const int64_t bb = dtype_block_bytes(dt);  // 34 (Q8_0) or 18 (Q4_0) bytes per 32 elements
  EXPECT_EQ(l.kv_row_bytes(), l.n_head_kv * (kHeadDim / 32) * bb);
  auto kv = std::move(m->load_state(*m->save_state(*st, 13))).value();
  for (int64_t i = 0; i < l.n_attention_layers(); ++i) {
    for (int64_t c = 0; c < 2; ++c) {
      const int64_t n = (c == 0 ? 8 : 5) * l.kv_row_bytes();
      EXPECT_EQ(0, std::memcmp(st->k_chunk(i, c).data, kv->k_chunk(i, c).data, static_cast<size_t>(n)));
      EXPECT_EQ(0, std::memcmp(st->v_chunk(i, c).data, kv->v_chunk(i, c).data, static_cast<size_t>(n)));
    }
  }

  // bb bytes per 32 elements (F32: 128); a stream of one KV layout does not load into another.
  EXPECT_EQ(m->state_layout().kv_slot_bytes() * 128, m32->state_layout().kv_slot_bytes() * bb);
  for (const Model* x : {mo.get(), m16.get(), m32.get()}) {
    EXPECT_NE(m->state_layout().fingerprint(), x->state_layout().fingerprint()) << dtype_name(x->options().kv_dtype);
    EXPECT_FALSE(x->load_state(bytes).is_ok()) << dtype_name(x->options().kv_dtype);
  }
  auto st16 = std::move(m16->new_state()).value();
  ASSERT_TRUE(m16->prefill(*st16, std::span<const int32_t>(toks.data(), 21)).is_ok());
  const auto bytes16 = std::move(m16->save_state(*st16, 21)).value();
  const auto foreign = m->load_state(bytes16);
  EXPECT_EQ(foreign.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.status().message().find("fingerprint"), std::string::npos) << foreign.status().message();

  // Close to the F32 cache, and really quantized.
  auto fresh = std::move(m->new_state()).value();
  auto st32 = std::move(m32->new_state()).value();
  ASSERT_TRUE(m->prefill(*fresh, toks).is_ok());
  ASSERT_TRUE(m32->prefill(*st32, toks).is_ok());
  const auto a = logits_of(*m, *fresh), b = logits_of(*m32, *st32);
  double err = 0;
  for (size_t i = 0; i < a.size(); ++i) err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
  EXPECT_LT(err, tol_f32);
  EXPECT_GT(err, 0.0);
}

INSTANTIATE_TEST_SUITE_P(KvTypes, StateIoQuantKv, ::testing::Values(DType::Q8_0, DType::Q4_0),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(KvPool, SlotOffsetsMatchViews) {
  auto m = test::load_tiny(false, opts());
  auto st = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, test::tokens(10)).is_ok());
  const KvPool& pool = *m->kv_pool();
  const StateLayout& l = pool.layout();
  ASSERT_EQ(l.n_attention_layers(), 2);
  EXPECT_EQ(pool.kv_bytes_per_layer(), l.kv_chunk_tokens * l.n_head_kv * l.head_dim * 4);
  for (int32_t slot : st->block_table()) {
    for (int64_t ai = 0; ai < l.n_attention_layers(); ++ai) {
      EXPECT_EQ(pool.k_view(slot, ai).data, pool.slot_data(slot) + pool.k_offset(ai));
      EXPECT_EQ(pool.v_view(slot, ai).data, pool.slot_data(slot) + pool.v_offset(ai));
      EXPECT_EQ(pool.v_offset(ai), pool.k_offset(ai) + pool.kv_bytes_per_layer());
    }
  }
  EXPECT_EQ(pool.v_offset(l.n_attention_layers() - 1) + pool.kv_bytes_per_layer(), l.kv_slot_bytes());
  EXPECT_EQ(st->device_slot_table(), nullptr);  // CPU states walk the host block table
}

TEST(SequenceStateReset, ZeroesRecurrentAndFreesKv) {
  auto m = test::load_tiny(false, opts());
  auto st = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, test::tokens(20)).is_ok());
  ASSERT_TRUE(st->reset().is_ok());
  EXPECT_EQ(st->pos(), 0);
  EXPECT_EQ(st->n_kv_chunks(), 0);
  EXPECT_FALSE(st->logits_valid());
  EXPECT_EQ(m->kv_pool()->used_slots(), 0);
  const auto* rec = static_cast<const uint8_t*>(st->recurrent_data());
  EXPECT_TRUE(std::all_of(rec, rec + st->recurrent_bytes(), [](uint8_t b) { return b == 0; }));
  // And it runs again like a fresh state.
  auto fresh = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, test::tokens(9)).is_ok());
  ASSERT_TRUE(m->prefill(*fresh, test::tokens(9)).is_ok());
  EXPECT_EQ(logits_of(*m, *st), logits_of(*m, *fresh));
}

TEST(DeviceCopy, CpuCopyAndZero) {
  std::vector<uint8_t> a(100), b(100, 7);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE(device_copy(b.data(), Device{}, a.data(), Device{}, 100).is_ok());
  EXPECT_EQ(a, b);
  ASSERT_TRUE(device_zero(b.data() + 10, Device{}, 20).is_ok());
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i], i >= 10 && i < 30 ? 0 : a[i]) << i;
  EXPECT_TRUE(device_copy(b.data(), Device{}, a.data(), Device{}, 0).is_ok());
  EXPECT_EQ(device_copy(b.data(), Device{}, a.data(), Device{}, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(device_zero(b.data(), Device{}, -1).code(), StatusCode::kInvalidArgument);
}

TEST(DeviceCopy, CpuRegions) {
  std::vector<uint8_t> a(100), b(100, 7);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i);
  const std::vector<CopyRegion> regions = {{b.data() + 50, a.data(), 10}, {b.data(), a.data() + 90, 10}, {b.data() + 20, a.data(), 0}};
  ASSERT_TRUE(device_copy_regions(Device{}, Device{}, regions).is_ok());
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(b[i], i >= 50 && i < 60 ? a[i - 50] : i < 10 ? a[i + 90] : 7) << i;
  }
  const std::vector<CopyRegion> bad = {{b.data(), a.data(), -1}};
  EXPECT_EQ(device_copy_regions(Device{}, Device{}, bad).code(), StatusCode::kInvalidArgument);
}

// The stream's payloads are the state's bytes in the documented order (state_io.h): K / V rows in
// token order across chunks (the last one partial), conv and SSM states, the logits. Disk snapshots
// written by earlier builds read back only while this holds.
TEST(StateIoFormat, PayloadsAreTheStateInTokenOrder) {
  auto m = test::load_tiny(false, opts());
  auto st = std::move(m->new_state()).value();
  const int64_t n = 21;  // chunks of 8: the third holds 5 tokens
  ASSERT_TRUE(m->prefill(*st, test::tokens(n)).is_ok());
  const auto bytes = state_serialize(*st, n);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  const KvPool& pool = *m->kv_pool();
  const StateLayout& l = pool.layout();
  const int64_t row = l.n_head_kv * l.head_dim * 4;
  size_t off = 64, n_checked = 0;
  uint32_t n_sections = 0;
  std::memcpy(&n_sections, bytes->data() + 28, 4);
  for (uint32_t i = 0; i < n_sections; ++i) {
    uint32_t len = 0;
    std::memcpy(&len, bytes->data() + off, 4);
    const std::string name(reinterpret_cast<const char*>(bytes->data() + off + 4), len);
    off += 4 + len + 4 + 4 + 32;
    uint64_t payload = 0;
    std::memcpy(&payload, bytes->data() + off, 8);
    off += 8 + 8 + 8;
    const uint8_t* p = bytes->data() + off;
    off += payload;
    if (name == "logits") {
      EXPECT_EQ(std::memcmp(p, st->logits().data(), payload), 0);
      ++n_checked;
      continue;
    }
    const int64_t il = std::stoll(name.substr(4));
    if (name.ends_with(".attn.k") || name.ends_with(".attn.v")) {
      int64_t ai = 0;
      for (int64_t j = 0; j < il; ++j) ai += l.kinds[static_cast<size_t>(j)] == LayerStateKind::kAttention;
      ASSERT_EQ(static_cast<int64_t>(payload), n * row) << name;
      for (int64_t t = 0; t < n; ++t) {
        const int32_t slot = st->block_table()[static_cast<size_t>(t / l.kv_chunk_tokens)];
        const TensorView v = name.ends_with(".attn.k") ? pool.k_view(slot, ai) : pool.v_view(slot, ai);
        EXPECT_EQ(std::memcmp(p + t * row, static_cast<const uint8_t*>(v.data) + (t % l.kv_chunk_tokens) * row, row), 0)
            << name << " token " << t;
      }
    } else {
      const TensorView v = name.ends_with(".deltanet.conv") ? st->conv_state(il) : st->ssm_state(il);
      ASSERT_EQ(static_cast<int64_t>(payload), v.n_bytes()) << name;
      EXPECT_EQ(std::memcmp(p, v.data, payload), 0) << name;
    }
    ++n_checked;
  }
  EXPECT_EQ(off, bytes->size());
  EXPECT_EQ(n_checked, 1 + 2 * l.n_attention_layers() + 2 * (l.n_layer() - l.n_attention_layers()));
}

TEST(HostBuffer, CpuBufferIsPlainZeroedAndAligned) {
  auto b = HostBuffer::alloc(Device{}, 1000, /*zero=*/true);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_FALSE(b->pinned());  // only a CUDA device's copies need locked pages
  EXPECT_EQ(b->bytes(), 1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 64, 0u);
  const auto* p = static_cast<const uint8_t*>(b->data());
  EXPECT_TRUE(std::all_of(p, p + 1000, [](uint8_t v) { return v == 0; }));
  HostBuffer moved = std::move(*b);
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(b->data(), nullptr);
  EXPECT_EQ(b->bytes(), 0);
  EXPECT_EQ(HostBuffer::alloc(Device{}, -1).status().code(), StatusCode::kInvalidArgument);
  auto empty = HostBuffer::alloc(Device{}, 0);
  ASSERT_TRUE(empty.is_ok());
  EXPECT_EQ(empty->data(), nullptr);
  // A CPU sequence's logits: n_vocab zeros, not locked.
  auto m = test::load_tiny(false, opts());
  auto st = std::move(m->new_state()).value();
  EXPECT_FALSE(st->logits_pinned());
  EXPECT_EQ(static_cast<int64_t>(st->logits().size()), m->n_vocab());
}

TEST(KvPool, BoundedPoolReportsExhaustion) {
  ModelOptions o = opts();
  o.max_kv_slots = 2;
  auto m = test::load_tiny(false, o);
  auto st = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, test::tokens(16)).is_ok());
  EXPECT_EQ(m->decode(*st, 1).code(), StatusCode::kResourceExhausted);
  st.reset();  // frees its slots
  EXPECT_EQ(m->kv_pool()->used_slots(), 0);
}

}  // namespace
}  // namespace ds
