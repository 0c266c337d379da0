// LocalEngine implementation: restore -> segmented prefill with snapshot saves -> decode loop.
#include "engine/local_engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <set>

#include "core/log.h"
#include "engine/ngram_draft.h"
#include "engine/sampler.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "state/state_io.h"

namespace ds {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

int32_t find_vocab_token(const GgufFile* gguf, std::string_view text) {
  if (!gguf) return -1;
  auto tokens = gguf->get_string_array("tokenizer.ggml.tokens");
  if (!tokens.is_ok()) return -1;
  for (size_t i = 0; i < tokens->size(); ++i) {
    if ((*tokens)[i] == text) return static_cast<int32_t>(i);
  }
  return -1;
}

uint64_t default_ram_budget() {
  const long pages = ::sysconf(_SC_AVPHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 1ull << 30;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 4;
}

}  // namespace

Result<DType> engine_parse_kv_type(const std::string& text, Device device) {
  if (text.empty()) return device.kind == DeviceKind::kCuda ? DType::F16 : DType::F32;
  if (text == "f16") return DType::F16;
  if (text == "f32") return DType::F32;
  if (text == "q8_0") return DType::Q8_0;
  if (text == "q4_0") return DType::Q4_0;
  return invalid_argument("--kv-type '{}': expected f16, f32, q8_0 or q4_0", text);
}

Result<Device> engine_parse_device(const std::string& text) {
  if (text == "cpu") return Device{};
  int64_t index = -1;
  if (text == "cuda") {
    index = 0;
  } else if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 8) {
    index = 0;
    for (size_t i = 5; i < text.size(); ++i) {
      if (text[i] < '0' || text[i] > '9') {
        index = -1;
        break;
      }
      index = index * 10 + (text[i] - '0');
    }
  }
  if (index < 0) {
    return invalid_argument("--device '{}': expected cpu or cuda:N (N = the CUDA device index, e.g. cuda:0)", text);
  }
#if DS_HAVE_CUDA
  return Device{DeviceKind::kCuda, static_cast<int>(index)};
#else
  return unsupported("--device {}: this build has no CUDA backend (rebuild with -DDELTASERVE_CUDA=ON), use --device cpu",
                     text);
#endif
}

struct LocalEngine::Restored {
  std::unique_ptr<SequenceState> state;
  int64_t n_tokens = 0;     // prompt tokens covered by the restored state
  double prefill_ms = 0;    // cost of computing that prefix from scratch
  bool from_disk = false;
  uint64_t bytes = 0;       // serialized size of the restored snapshot, its chain included
  std::shared_ptr<const Snapshot> snapshot;  // the snapshot restored (the next one's parent)
};

LocalEngine::~LocalEngine() = default;

void LocalEngine::release_saved_states() {
  saver_->wait_idle();
  held_states_.clear();
}

void LocalEngine::wait_snapshots() { saver_->wait_idle(); }

void LocalEngine::flush_snapshots() {
  saver_->wait_idle();
  if (disk_) disk_->flush();
}

Status engine_check_draft(const EngineOptions& options) {
  const std::string& d = options.draft;
  if (d != "" && d != "none" && d != "off" && d != "ngram") {
    return invalid_argument("--draft '{}': expected ngram or none", d);
  }
  if (options.draft_max < 1 || options.draft_max > kMaxVerifyTokens - 1) {
    return invalid_argument("--draft-max {}: expected 1 to {}", options.draft_max, kMaxVerifyTokens - 1);
  }
  return Status::ok();
}

Result<std::unique_ptr<LocalEngine>> LocalEngine::open(const std::string& model_path, const EngineOptions& options) {
  DS_TRY(engine_check_draft(options));
  std::unique_ptr<LocalEngine> e(new LocalEngine());
  e->draft_ngram_ = engine_drafts(options);
  e->options_ = options;
  e->saver_ = std::make_unique<SerialWorker>();
  ModelOptions mo;
  mo.n_threads = options.n_threads;
  mo.n_ctx = options.n_ctx;
  mo.prefill_chunk = options.prefill_chunk;
  mo.cuda_graphs = options.cuda_graphs;
  DS_ASSIGN_OR_RETURN(mo.device, engine_parse_device(options.device));
  DS_ASSIGN_OR_RETURN(mo.kv_dtype, engine_parse_kv_type(options.kv_type, mo.device));
  DS_ASSIGN_OR_RETURN(e->model_, Model::load(model_path, mo));
  const Model& m = *e->model_;
  const GgufFile* gguf = m.gguf();

  EngineInfo& info = e->info_;
  info.model_name = m.config().name.empty() ? std::filesystem::path(model_path).stem().string() : m.config().name;
  info.architecture = model_arch_name(m.config().arch);
  info.n_ctx = m.n_ctx();
  info.n_vocab = m.n_vocab();
  std::set<int32_t> eos;
  if (gguf) {
    auto id = gguf->get_int("tokenizer.ggml.eos_token_id");
    if (id.is_ok() && *id >= 0 && *id < info.n_vocab) eos.insert(static_cast<int32_t>(*id));
  }
  for (const char* t : {"<|im_end|>", "<|endoftext|>"}) {
    const int32_t id = find_vocab_token(gguf, t);
    if (id >= 0) eos.insert(id);
  }
  info.eos_tokens.assign(eos.begin(), eos.end());
  e->boundary_token_ = find_vocab_token(gguf, "<|im_start|>");

  e->fingerprint_ = fmt::format("deltaserve-state-v1 arch={} model={:016x} n_vocab={} kv_chunk={} kv={}",
                                info.architecture, m.fingerprint(), info.n_vocab, m.options().kv_chunk_tokens,
                                dtype_name(mo.kv_dtype));
  const uint64_t ram = options.cache_ram_bytes < 0 ? default_ram_budget()
                                                   : static_cast<uint64_t>(options.cache_ram_bytes);
  if (ram > 0) e->ram_ = std::make_unique<PrefixCache>(ram);
  if (!options.kv_cache_dir.empty()) {
    DiskStoreOptions so{options.kv_cache_dir, e->fingerprint_, options.kv_cache_disk_budget, 8};
    so.whole_stream = [layout = m.kv_pool()->layout()](const Snapshot& snap) {
      return state_stream_join(snap.chain(), layout);
    };
    auto disk = DiskSnapshotStore::open(so);
    if (disk.is_ok()) {
      e->disk_ = std::move(disk).value();
    } else {
      DS_LOG_WARN("disk snapshot cache disabled: {}", disk.status().to_string());
    }
  }
  DS_LOG_INFO("engine: {} ({}) on {}, n_ctx {}, vocab {}, snapshot RAM budget {} MiB, disk {}", info.model_name,
              info.architecture, m.device().to_string(), info.n_ctx, info.n_vocab, ram >> 20,
              e->disk_ ? e->disk_->dir() : "off");
  return e;
}

std::vector<int64_t> LocalEngine::split_points(const std::vector<int32_t>& prompt, int64_t from) const {
  const int64_t n = static_cast<int64_t>(prompt.size());
  std::set<int64_t> points;
  if (boundary_token_ >= 0) {
    for (int64_t p = from + 1; p < n; ++p) {
      if (prompt[p] == boundary_token_) points.insert(p);
    }
  }
  if (options_.checkpoint_every > 0) {
    for (int64_t p = (from / options_.checkpoint_every + 1) * options_.checkpoint_every; p < n;
         p += options_.checkpoint_every) {
      points.insert(p);
    }
  }
  if (n > from) points.insert(n);
  return {points.begin(), points.end()};
}

Result<LocalEngine::Restored> LocalEngine::restore_longest(const std::vector<int32_t>& prompt) {
  Restored r;
  std::shared_ptr<const Snapshot> snap;
  if (ram_) snap = ram_->find(prompt);
  if (disk_) {
    const size_t have = snap ? snap->tokens.size() : 0;
    auto info = disk_->find(prompt);
    if (info && info->tokens.size() > have) {
      auto loaded = disk_->load(*info);  // verifies; a bad file is quarantined
      if (loaded.is_ok()) {
        snap = std::move(loaded).value();
        r.from_disk = true;
        if (ram_) ram_->put(snap);
      }
    }
  }
  if (snap) {
    auto state = restore_snapshot(*snap);
    if (state.is_ok() && (*state)->pos() == static_cast<int64_t>(snap->tokens.size()) && (*state)->logits_valid()) {
      r.state = std::move(state).value();
      r.n_tokens = static_cast<int64_t>(snap->tokens.size());
      r.prefill_ms = snap->prefill_ms;
      r.bytes = snap->chain_bytes();
      r.snapshot = std::move(snap);
      return r;
    }
    DS_LOG_WARN("snapshot of {} tokens could not be restored ({}); prefilling from scratch", snap->tokens.size(),
                state.is_ok() ? "state incomplete" : state.status().to_string());
    r.from_disk = false;
  }
  DS_ASSIGN_OR_RETURN(r.state, model_->new_state());
  return r;
}

Result<std::unique_ptr<SequenceState>> LocalEngine::restore_snapshot(const Snapshot& snap) {
  const auto chain = snap.chain();
  DS_ASSIGN_OR_RETURN(auto state, model_->new_state());
  for (size_t i = 0; i < chain.size(); ++i) {
    DS_TRY(model_->load_state_into(chain[i], *state, /*with_recurrent=*/i + 1 == chain.size()));
  }
  return state;
}

std::shared_ptr<const Snapshot> LocalEngine::save_snapshot(const SequenceState& state, const std::vector<int32_t>& prompt,
                                                           int64_t b, double prefill_ms,
                                                           std::shared_ptr<const Snapshot> parent) {
  if (!ram_ && !disk_) return nullptr;
  // A delta on the snapshot this state continues, unless its chain is long: a restore loads every link.
  if (parent && (parent->depth() + 1 >= kMaxSnapshotChain || parent->tokens.size() >= static_cast<size_t>(b))) {
    parent = nullptr;
  }
  auto cap = state_capture(state, b, 0, -1, parent ? static_cast<int64_t>(parent->tokens.size()) : 0);
  if (!cap.is_ok()) {
    DS_LOG_WARN("snapshot at {} not saved: {}", b, cap.status().to_string());
    return nullptr;
  }
  auto snap = std::make_shared<Snapshot>();
  snap->tokens.assign(prompt.begin(), prompt.begin() + b);
  snap->parent = std::move(parent);
  snap->prefill_ms = prefill_ms;
  auto pending = std::make_shared<StateCapture>(std::move(cap).value());
  saver_->submit([this, snap, pending] {
    if (snap->parent && snap->parent->state.empty()) {
      DS_LOG_WARN("snapshot at {} not saved: the snapshot it continues was not", snap->tokens.size());
      return;
    }
    auto bytes = state_capture_finish(std::move(*pending));
    if (!bytes.is_ok()) {
      DS_LOG_WARN("snapshot at {} not saved: {}", snap->tokens.size(), bytes.status().to_string());
      return;
    }
    snap->state = std::move(bytes).value();
    if (ram_) ram_->put(snap);
    if (disk_) disk_->put_async(snap);
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.snapshots_saved++;
  });
  return snap;
}

Result<GenerateResult> LocalEngine::generate(const GenerateRequest& req) {
  const auto t_start = Clock::now();
  const std::vector<int32_t>& prompt = req.prompt;
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n == 0) return invalid_argument("empty prompt");
  if (n >= info_.n_ctx) {
    return invalid_argument("prompt of {} tokens does not fit the context of {} tokens", n, info_.n_ctx);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (prompt[i] < 0 || prompt[i] >= info_.n_vocab) {
      return invalid_argument("prompt token {} at position {} is outside the vocabulary of {}", prompt[i], i, info_.n_vocab);
    }
  }
  const int64_t max_tokens = std::min<int64_t>(std::max<int32_t>(req.max_tokens, 0), info_.n_ctx - n);
  auto cancelled = [&] { return req.cancelled && req.cancelled(); };

  GenerateResult result;
  result.prompt_tokens = n;
  const auto t_restore = Clock::now();
  release_saved_states();  // the previous request's snapshots, stored before this one looks for them
  DS_ASSIGN_OR_RETURN(Restored restored, restore_longest(prompt));
  // The state outlives this call while snapshots of it are being copied out.
  struct Hold {
    std::vector<std::unique_ptr<SequenceState>>& held;
    std::unique_ptr<SequenceState>& state;
    ~Hold() { held.push_back(std::move(state)); }
  } hold{held_states_, restored.state};
  result.restore_ms = ms_since(t_restore);
  result.restored_bytes = restored.bytes;
  SequenceState& state = *restored.state;
  result.cached_tokens = restored.n_tokens;

  // Snapshots are saved at the last turn boundary of the prompt (the prefix the next request of a
  // conversation shares), at checkpoint multiples, and at the end of the prompt.
  const std::vector<int64_t> splits = split_points(prompt, restored.n_tokens);
  std::set<int64_t> save_at = {n};
  for (int64_t p : splits) {
    if (options_.checkpoint_every > 0 && p % options_.checkpoint_every == 0) save_at.insert(p);
  }
  for (int64_t p = n - 1; p > restored.n_tokens; --p) {
    if (prompt[p] == boundary_token_) {
      save_at.insert(p);
      break;
    }
  }

  const auto t_prefill = t_restore;
  int64_t pos = restored.n_tokens;
  std::shared_ptr<const Snapshot> parent = restored.snapshot;  // what the state's KV so far is saved in
  for (int64_t s : splits) {
    if (cancelled()) {
      result.finish = FinishReason::kCancelled;
      result.prefill_ms = ms_since(t_prefill);
      return result;
    }
    DS_TRY(model_->prefill(state, std::span<const int32_t>(prompt).subspan(pos, s - pos)));
    pos = s;
    if (save_at.count(s)) {
      const auto t_save = Clock::now();
      auto saved = save_snapshot(state, prompt, s, restored.prefill_ms + ms_since(t_prefill), parent);
      if (saved) parent = std::move(saved);
      result.snapshot_ms += ms_since(t_save);
    }
  }
  result.prefill_ms = ms_since(t_prefill);

  const auto t_decode = Clock::now();
  Sampler sampler(req.sampling);
  state.set_want_top_k(options_.step_top_k && sampler.top_k_needed(kTopKMax) > 0);
  std::vector<int32_t>& out = result.tokens;
  result.finish = FinishReason::kLength;
  // Takes a generated token: false when generation ends with it (stop token, the caller stopped,
  // cancelled, max_tokens reached), result.finish then set.
  const auto emit = [&](int32_t tok) {
    out.push_back(tok);
    const bool is_stop = (!req.ignore_eos && std::find(info_.eos_tokens.begin(), info_.eos_tokens.end(), tok) != info_.eos_tokens.end()) ||
                         std::find(req.stop_tokens.begin(), req.stop_tokens.end(), tok) != req.stop_tokens.end();
    const bool keep = req.on_token ? req.on_token(tok) : true;
    if (is_stop) {
      result.finish = FinishReason::kStop;
      return false;
    }
    if (!keep || cancelled()) {
      result.finish = cancelled() ? FinishReason::kCancelled : FinishReason::kStop;
      return false;
    }
    return static_cast<int64_t>(out.size()) < max_tokens;
  };
  // The next token from the state's last step. A step that returned only its best logits is sampled
  // from them; one whose selection overflowed (values tied across the vocabulary) fetches its row.
  const auto sample_state = [&]() -> Result<int32_t> {
    if (state.top_k_valid() && state.top_k().n < 1) DS_TRY(model_->fetch_logits(state));
    return state.top_k_valid() ? sampler.sample_top(state.top_k()) : sampler.sample(model_->logits(state), prompt, out);
  };
  // Speculative decoding: a verify step checks a draft of what follows each token. Each verify row is
  // sampled in order, exactly as a decode step's logits would be (one draw per token taken, the same
  // generator), and a draft token is taken only where the sample equals it: the output is the tokens
  // of plain decoding, for greedy and sampled requests alike (on CUDA up to the float rounding between
  // the verify's kernels and the decode step's); a draft saves the steps it got right. It
  // takes whole rows where the sampler needs them (penalties, top-k above 64), else (CUDA) best logits.
  std::optional<NgramDraft> drafter;
  const bool whole_rows = sampler.top_k_needed(kTopKMax) == 0;
  if (draft_ngram_) {
    drafter.emplace(NgramDraftOptions{});
    drafter->reset(prompt);
  }
  const int64_t draft_cap = std::min<int64_t>(options_.draft_max, model_->max_verify_tokens() - 1);
  // Draft length: grows by 2 after a draft wholly accepted, shrinks by 1 after one that was not, so a
  // stretch the drafts miss costs verifies of few tokens.
  int64_t draft_len = draft_cap;
  const auto sample_row = [&](int64_t i) {
    const Model::VerifyRow row = model_->verify_row(i);
    return row.top_k != nullptr ? sampler.sample_top(*row.top_k) : sampler.sample(row.logits, prompt, out);
  };
  if (max_tokens > 0) {
    DS_ASSIGN_OR_RETURN(int32_t next, sample_state());
    while (emit(next)) {
      const int32_t tok = next;
      std::vector<int32_t> draft;
      if (drafter) {
        drafter->append(tok);
        // A verify emits up to its draft's length + 1 tokens.
        draft = drafter->propose(static_cast<int32_t>(std::min<int64_t>(draft_len, max_tokens - static_cast<int64_t>(out.size()) - 1)));
      }
      if (draft.empty()) {
        DS_TRY(model_->decode(state, tok));
        DS_ASSIGN_OR_RETURN(next, sample_state());
        continue;
      }
      draft.insert(draft.begin(), tok);
      DS_TRY(model_->verify(state, draft, whole_rows));
      const int64_t n_draft = static_cast<int64_t>(draft.size()) - 1;
      int64_t m = 0;  // draft tokens taken: each is the sample of the row before it
      bool going = true;
      next = sample_row(0);
      while (m < n_draft && next == draft[static_cast<size_t>(m + 1)]) {
        ++m;
        drafter->append(next);
        going = emit(next);
        if (!going) break;
        next = sample_row(m);
      }
      DS_TRY(model_->keep_verified(state, m + 1));
      draft_len = m == n_draft ? std::min(draft_cap, draft_len + 2) : std::max<int64_t>(1, draft_len - 1);
      result.verify_steps++;
      result.draft_tokens += n_draft;
      result.accepted_tokens += m;
      if (!going) break;
    }
  }
  result.decode_ms = ms_since(t_decode);

  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.requests++;
    stats_.prompt_tokens += n;
    stats_.cached_tokens += restored.n_tokens;
    stats_.generated_tokens += out.size();
    stats_.draft_tokens += static_cast<uint64_t>(result.draft_tokens);
    stats_.accepted_tokens += static_cast<uint64_t>(result.accepted_tokens);
    stats_.prefill_seconds += result.prefill_ms / 1000;
    stats_.decode_seconds += result.decode_ms / 1000;
    if (restored.n_tokens > 0) (restored.from_disk ? stats_.cache_disk_hits : stats_.cache_ram_hits)++;
    else stats_.cache_misses++;
    // The model's counters, read here on the thread that runs its steps (stats() may run on another).
    const CudaGraphStats g = model_->cuda_graph_stats();
    stats_.graph_captured_steps = static_cast<uint64_t>(g.captures);
    stats_.graph_replayed_steps = static_cast<uint64_t>(g.replays - g.captures);  // a capture's own run counts as a replay
    stats_.graph_op_by_op_steps = static_cast<uint64_t>(g.uncaptured);
  }
  DS_LOG_INFO("request: prompt {} tokens ({} cached{}), generated {}{}, prefill {:.1f} ms, decode {:.1f} ms, total {:.1f} ms",
              n, restored.n_tokens, restored.from_disk ? " from disk" : "", out.size(),
              result.verify_steps > 0 ? fmt::format(" ({} of {} draft tokens accepted in {} verify steps)",
                                                    result.accepted_tokens, result.draft_tokens, result.verify_steps)
                                      : std::string(),
              result.prefill_ms, result.decode_ms, ms_since(t_start));
  return result;
}

EngineStats LocalEngine::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  EngineStats s = stats_;
  if (ram_) s.cache_ram_bytes = ram_->stats().bytes_used;
  if (disk_) s.cache_disk_bytes = disk_->stats().bytes;
  return s;
}

Result<std::unique_ptr<Engine>> engine_open(const std::string& model_path, const EngineOptions& options) {
  DS_ASSIGN_OR_RETURN(auto engine, LocalEngine::open(model_path, options));
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace ds
