// Opening a checkpoint's safetensors files and canonicalizing tensor names. The one non-obvious
// choice: when an index file exists it is authoritative (only the shards it names are opened, and
// every tensor it lists must be found in the shard it names), so a stray file in the directory
// cannot add or shadow tensors.
#include "convert/hf_weights.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/log.h"

namespace ds::convert {
namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<std::unique_ptr<HfWeights>> HfWeights::open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::unique_ptr<HfWeights> w(new HfWeights());
  w->dir_ = dir;
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  std::error_code ec;
  if (fs::exists(index, ec)) {
    std::ifstream in(index, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
      return corrupt("{}: not valid JSON: {}", index, e.what());
    }
    auto wm = j.find("weight_map");
    if (!j.is_object() || wm == j.end() || !wm->is_object()) {
      return corrupt("{}: missing object 'weight_map'", index);
    }
    std::map<std::string, std::string> expected;  // tensor -> shard
    std::set<std::string> shards;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) return corrupt("{}: weight_map entry '{}' is not a file name", index, it.key());
      const std::string shard = it.value().get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "..") {
        return corrupt("{}: weight_map entry '{}' names '{}', not a file in the directory", index, it.key(), shard);
      }
      expected[it.key()] = shard;
      shards.insert(shard);
    }
    for (const auto& shard : shards) DS_TRY(w->add_file((fs::path(dir) / shard).string()));
    for (const auto& [tensor, shard] : expected) {
      bool found = false;
      for (const auto& f : w->files_) {
        if (fs::path(f->name()).filename() == shard && f->find(tensor) != nullptr) found = true;
      }
      if (!found) return corrupt("{}: tensor '{}' is listed in shard {} but not found there", index, tensor, shard);
    }
  } else if (fs::exists(single, ec)) {
    DS_TRY(w->add_file(single));
  } else {
    return not_found("{}: no model.safetensors or model.safetensors.index.json", dir);
  }
  if (w->n_dropped_visual_ > 0) {
    DS_LOG_INFO("convert: dropping {} vision tensors (visual.*); they belong in a separate projector file",
                w->n_dropped_visual_);
  }
  if (w->n_dropped_mtp_ > 0) {
    DS_LOG_INFO("convert: dropping {} multi-token-prediction tensors (mtp.*); MTP layers are not converted",
                w->n_dropped_mtp_);
  }
  return w;
}

Status HfWeights::add_file(const std::string& path) {
  DS_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
  for (const auto& t : file->tensors()) {
    std::string name = t.name;
    std::string prefix;
    for (const char* p : {"model.language_model.", "language_model.model.", "language_model.", "model."}) {
      if (starts_with(name, p)) {
        prefix = p;
        name = name.substr(prefix.size());
        break;
      }
    }
    if (starts_with(name, "visual.")) {
      ++n_dropped_visual_;
      continue;
    }
    if (starts_with(name, "mtp.")) {
      ++n_dropped_mtp_;
      continue;
    }
    if (!prefix.empty()) prefix_ = prefix;
    auto [it, inserted] = by_name_.emplace(name, Entry{&t, t.name});
    if (!inserted) {
      return corrupt("{}: tensor '{}' duplicates '{}' (both are '{}' once prefixes are removed)", path, t.name,
                     it->second.original, name);
    }
  }
  files_.push_back(std::move(file));
  return Status::ok();
}

const SafetensorsTensor* HfWeights::find(const std::string& canonical) const {
  auto it = by_name_.find(canonical);
  if (it == by_name_.end()) return nullptr;
  used_.insert(canonical);
  return it->second.tensor;
}

Result<const SafetensorsTensor*> HfWeights::get(const std::string& canonical,
                                                const std::vector<int64_t>& shape) const {
  const SafetensorsTensor* t = find(canonical);
  if (t == nullptr) return not_found("{}: tensor '{}' is missing", dir_, original_name(canonical));
  if (t->shape != shape) {
    return invalid_argument("{}: tensor '{}' has shape {}, expected {}", dir_, original_name(canonical),
                            shape_to_string(t->shape), shape_to_string(shape));
  }
  return t;
}

std::string HfWeights::original_name(const std::string& canonical) const {
  auto it = by_name_.find(canonical);
  if (it != by_name_.end()) return it->second.original;
  if (starts_with(canonical, "lm_head.")) return canonical;
  return prefix_ + canonical;
}

std::vector<std::string> HfWeights::unused() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : by_name_) {
    if (used_.count(name) == 0) out.push_back(e.original);
  }
  return out;
}

}  // namespace ds::convert
