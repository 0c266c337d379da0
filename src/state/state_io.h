// Serialization of a SequenceState into a self-describing, checksummed byte stream, and back.
// Snapshots, the disk cache, shard export and spec-decode rollback all use this.
// Non-obvious choices: a stream cut at a boundary b < pos carries only the attention KV of [0, b)
// (recurrent state exists only at the current position); loading it yields a state that the model
// refuses to continue from until recurrent state is restored. A stream may start its KV at a token
// f > 0 (a delta): it is loaded on top of a state at position f, so snapshots of one prompt's
// checkpoints, or of a conversation's turns, each hold only their own KV rows.
//
// Format (little-endian), version 2 (a stream of KV from token 0 is written as version 1, byte for byte
// what version 1 readers read):
//   offset size  meaning
//   0      4     magic "DSSQ" (0x51535344)
//   4      2     write version (1, or 2 for KV from f > 0)
//   6      2     oldest reader version that can read it (the same)
//   8      8     layout fingerprint (StateLayout::fingerprint: model identity + every dimension)
//   16     8     n_tokens: the boundary b (KV positions [f, b))
//   24     4     flags: bit 0 recurrent state included, bit 1 logits included
//   28     4     n_sections
//   32     4     first layer of the stream's layer range
//   36     4     end of the layer range (exclusive); [0, n_layer) for a whole state
//   40     8     f: the first KV position carried (0 in version 1, where these bytes were reserved)
//   48     8     reserved, zero
//   56     8     XXH3-64 of bytes [0, 56)
// then n_sections sections, each:
//   u32 name_len, name bytes (<= 64, e.g. "blk.3.attn.k"), u32 dtype (ggml id: F32, or the KV dtype),
//   u32 n_dims (1..4), 4 x i64 ne, u64 payload_bytes, u64 XXH3-64 of the section header fields above,
//   u64 XXH3-64 of the payload, payload bytes.
// Sections, in this order: "logits" [n_vocab] (if flag bit 1); per attention layer in the range
// "blk.N.attn.k" and
// "blk.N.attn.v" ne {head_dim, n_head_kv, b - f} in the layout's KV dtype (F32, F16, or Q8_0 / Q4_0: each
// head's row head_dim / 32 blocks of 34 / 18 bytes); per recurrent layer in the range (if flag bit 0)
// "blk.N.deltanet.conv" ne {conv_dim, K-1} and "blk.N.deltanet.ssm" ne {dv, dk, nv}.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "state/sequence_state.h"

namespace ds {

constexpr uint32_t kStateMagic = 0x51535344;  // "DSSQ"
constexpr uint16_t kStateVersion = 2;  // what this build reads (and writes for KV from f > 0)

// Serializes the state up to token boundary `n_tokens` (0 <= n_tokens <= pos), its KV from token
// kv_from on (0: all of it). The recurrent state and logits are included only when n_tokens == pos. A
// layer range [layer_first, layer_last) exports only those layers (a shard's part of a split state);
// layer_last = -1 means all layers.
Result<std::vector<uint8_t>> state_serialize(const SequenceState& state, int64_t n_tokens, int64_t layer_first = 0,
                                             int64_t layer_last = -1, int64_t kv_from = 0);
// A stream taken in two steps, so that a state can run on while its KV rows are copied out:
// state_capture copies at once what the model's next step changes (recurrent state, logits) and notes
// where the KV rows lie; state_capture_finish, on any thread, copies those rows and assembles the stream
// (the bytes state_serialize writes). In between, the KV rows [kv_from, n_tokens) must stay in place:
// the state must not be destroyed, reset or truncated below n_tokens until state_capture_finish returns.
struct StateCaptureData;
class StateCapture {
 public:
  StateCapture();
  ~StateCapture();
  StateCapture(StateCapture&&) noexcept;
  StateCapture& operator=(StateCapture&&) noexcept;
  int64_t n_tokens() const;

 private:
  friend Result<StateCapture> state_capture(const SequenceState&, int64_t, int64_t, int64_t, int64_t);
  friend Result<std::vector<uint8_t>> state_capture_finish(StateCapture&&);
  std::unique_ptr<StateCaptureData> d_;
};
Result<StateCapture> state_capture(const SequenceState& state, int64_t n_tokens, int64_t layer_first = 0,
                                   int64_t layer_last = -1, int64_t kv_from = 0);
Result<std::vector<uint8_t>> state_capture_finish(StateCapture&& capture);

// Parses and verifies a stream (magic, versions, fingerprint against pool's layout, every section's
// name, shape and checksums) and builds a new state from it (a stream of KV from token 0).
Result<std::unique_ptr<SequenceState>> state_deserialize(std::span<const uint8_t> bytes,
                                                         std::shared_ptr<KvPool> pool);
// The same into an existing state: a fresh one (position 0, no KV); one already at the stream's
// position, so the layer-range streams of a split state can be imported one after another; or, for a
// stream of KV from token f > 0, one at position f. Without `with_recurrent` only the KV is taken (a
// link in the middle of a chain of deltas): the state then has no recurrent part and no logits. The
// whole stream is verified before any byte reaches the state; a failed copy may leave it partly
// written: reset or discard it then.
Status state_deserialize_into(std::span<const uint8_t> bytes, SequenceState& state, bool with_recurrent = true);

// One whole stream (KV from token 0) from a chain: a stream of KV from 0, then streams that each start
// their KV where the one before ends (same layer range). Byte-identical to state_serialize of the state
// the chain restores. Every link is verified.
Result<std::vector<uint8_t>> state_stream_join(std::span<const std::span<const uint8_t>> chain,
                                               const StateLayout& layout);

}  // namespace ds
