// LocalEngine: runs requests on an in-process Model, one at a time, and never prefills the same
// prefix twice. For each prompt it restores the longest cached snapshot (RAM, then disk) whose tokens
// are a prefix of the prompt, prefills only the rest, and saves new snapshots at boundaries.
//
// Non-obvious choice: prefill is split at *every* boundary candidate of the prompt (each
// <|im_start|> position and each multiple of the checkpoint interval), whether or not a snapshot is
// saved or restored there. Split points are then a function of the token prefix alone, so
// "restore at b + prefill the tail" runs exactly the same chunks as an uncached run, and greedy output
// after a hit is identical to the uncached output.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/serial_worker.h"
#include "engine/engine.h"
#include "state/prefix_cache.h"
#include "store/disk_store.h"

namespace ds {

class Model;
class SequenceState;

class LocalEngine : public Engine {
 public:
  static Result<std::unique_ptr<LocalEngine>> open(const std::string& model_path,
                                                   const EngineOptions& options);
  ~LocalEngine() override;

  const EngineInfo& info() const override { return info_; }
  Result<GenerateResult> generate(const GenerateRequest& request) override;

  EngineStats stats() const override;
  Model& model() { return *model_; }
  PrefixCache* ram_cache() { return ram_.get(); }
  DiskSnapshotStore* disk_store() { return disk_.get(); }
  // Waits for the snapshots still being copied out of the last request's state (they reach the RAM
  // tier and the disk writer's queue when done); the next request waits for them too, first.
  void wait_snapshots();
  // That, then the disk writer's queue.
  void flush_snapshots();
  // Identity written into disk snapshots: model fingerprint, sizes and state layout.
  const std::string& fingerprint_text() const { return fingerprint_; }

 private:
  LocalEngine() = default;
  // Split points of a prompt in (from, n]: every boundary token position, checkpoint multiple, and n.
  std::vector<int64_t> split_points(const std::vector<int32_t>& prompt, int64_t from) const;
  struct Restored;
  Result<Restored> restore_longest(const std::vector<int32_t>& prompt);
  // A state from a snapshot's chain (every link's KV, the last one's recurrent state and logits).
  Result<std::unique_ptr<SequenceState>> restore_snapshot(const Snapshot& snap);
  // Saves the state at b (= its position) to the tiers: a delta on `parent` (the snapshot the state's
  // KV up to parent's length was restored from or saved to) when there is one. Takes what the next
  // step changes now and copies the KV rows on the saver's thread, which stores the snapshot when
  // done; the state must be kept until then (held_states_). Returns the snapshot (its stream not yet
  // written), or null when none will be saved.
  std::shared_ptr<const Snapshot> save_snapshot(const SequenceState& state, const std::vector<int32_t>& prompt,
                                                int64_t b, double prefill_ms, std::shared_ptr<const Snapshot> parent);

  // Deltas on deltas up to this many links; then a whole snapshot starts a new chain.
  static constexpr int kMaxSnapshotChain = 32;

  // Waits for the last request's snapshot copies, then frees the state they were copied from.
  void release_saved_states();

  std::unique_ptr<Model> model_;
  EngineOptions options_;
  EngineInfo info_;
  int32_t boundary_token_ = -1;  // <|im_start|>: a turn starts here
  bool draft_ngram_ = false;     // speculative decoding with n-gram drafts (EngineOptions::draft)
  std::unique_ptr<PrefixCache> ram_;
  std::unique_ptr<DiskSnapshotStore> disk_;
  std::string fingerprint_;
  mutable std::mutex stats_mutex_;  // guards stats_ (generate runs on one thread, metrics on others)
  EngineStats stats_;
  // States whose snapshots may still be copying out (their KV must stay); freed at the next request.
  // Declared after model_ and before saver_: the saver's thread ends first, then these go, then the model.
  std::vector<std::unique_ptr<SequenceState>> held_states_;
  std::unique_ptr<SerialWorker> saver_;  // finishes snapshot captures, each after its parent's
};

}  // namespace ds
