// `deltaserve run MODEL -p TEXT | --tokens IDS`: one prompt, generation to stdout, speeds to stderr.
// With --chat the prompt is rendered as one user turn through the Qwen3.5 chat template.
#include <cstdio>
#include <sstream>

#include "cli/command.h"
#include "engine/local_engine.h"
#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace {

struct Options {
  std::string model;
  std::string prompt;
  std::string tokens;
  int32_t n_predict = 64;
  bool chat = false;
  bool no_think = false;
  bool print_ids = false;
  ds::EngineOptions engine;
  ds::SamplingParams sampling;
};

ds::Status parse_ids(const std::string& s, std::vector<int32_t>* out) {
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      out->push_back(static_cast<int32_t>(v));
    } catch (...) {
      return ds::invalid_argument("--tokens: '{}' is not an integer token id", item);
    }
  }
  if (out->empty()) return ds::invalid_argument("--tokens: no token ids given");
  return ds::Status::ok();
}

ds::Status run(const Options& o) {
  if (o.prompt.empty() == o.tokens.empty()) return ds::invalid_argument("give exactly one of -p TEXT or --tokens IDS");
  ds::EngineOptions eo = o.engine;
  eo.cache_ram_bytes = 0;  // one request: no snapshots
  DS_ASSIGN_OR_RETURN(auto engine, ds::LocalEngine::open(o.model, eo));
  std::unique_ptr<ds::Tokenizer> tok;
  if (engine->model().gguf()) {
    auto t = ds::Tokenizer::from_gguf(*engine->model().gguf());
    if (t.is_ok()) tok = std::move(t).value();
    else if (!o.prompt.empty()) return t.status().with_context("tokenizer");
  }
  ds::GenerateRequest req;
  if (!o.tokens.empty()) {
    DS_TRY(parse_ids(o.tokens, &req.prompt));
  } else {
    std::string text = o.prompt;
    if (o.chat) {
      ds::ChatRenderOptions ro;
      ro.enable_thinking = !o.no_think;
      DS_ASSIGN_OR_RETURN(text, ds::render_chat({ds::ChatMessage{.role = "user", .content = o.prompt}}, ro));
    }
    req.prompt = tok->encode(text, /*allow_special=*/o.chat);
  }
  req.max_tokens = o.n_predict;
  req.sampling = o.sampling;
  std::unique_ptr<ds::StreamDecoder> dec;
  if (tok) dec = std::make_unique<ds::StreamDecoder>(*tok);
  req.on_token = [&](int32_t id) {
    if (o.print_ids || !dec) {
      std::printf("%d ", id);
    } else {
      std::fputs(dec->push(id).c_str(), stdout);
    }
    std::fflush(stdout);
    return true;
  };
  DS_ASSIGN_OR_RETURN(auto res, engine->generate(req));
  if (dec && !o.print_ids) std::fputs(dec->flush().c_str(), stdout);
  std::printf("\n");
  const double pp = res.prefill_ms > 0 ? 1000.0 * res.prompt_tokens / res.prefill_ms : 0;
  const double tg = res.decode_ms > 0 && res.tokens.size() > 1 ? 1000.0 * (res.tokens.size() - 1) / res.decode_ms : 0;
  std::fprintf(stderr, "prompt: %lld tokens in %.1f ms (%.1f tok/s); generated %zu tokens in %.1f ms (%.1f tok/s)\n",
               static_cast<long long>(res.prompt_tokens), res.prefill_ms, pp, res.tokens.size(), res.decode_ms, tg);
  if (res.verify_steps > 0) {
    std::fprintf(stderr, "draft: %lld of %lld draft tokens accepted in %lld verify steps\n",
                 static_cast<long long>(res.accepted_tokens), static_cast<long long>(res.draft_tokens),
                 static_cast<long long>(res.verify_steps));
  }
  return ds::Status::ok();
}

void setup(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<Options>();
  app.add_option("model", o->model, "GGUF model file")->required();
  app.add_option("-p,--prompt", o->prompt, "Prompt text");
  app.add_option("--tokens", o->tokens, "Prompt as comma-separated token ids (instead of -p)");
  app.add_option("-n,--n-predict", o->n_predict, "Tokens to generate")->capture_default_str();
  app.add_flag("--chat", o->chat, "Render the prompt as a user turn with the chat template");
  app.add_flag("--no-think", o->no_think, "With --chat: thinking off");
  app.add_flag("--print-ids", o->print_ids, "Print generated token ids instead of text");
  app.add_option("-t,--threads", o->engine.n_threads, "CPU threads (0 = all cores)")->capture_default_str();
  app.add_option("-c,--ctx-size", o->engine.n_ctx, "Context size in tokens (0 = model default, capped at 32768)");
  app.add_option("--prefill-chunk", o->engine.prefill_chunk,
                 "Prefill chunk in tokens (0 = auto: 256 on the CPU; on CUDA 4096 on devices of 28 GiB or more, "
                 "else 1024)")
      ->capture_default_str();
  app.add_option("--device", o->engine.device, "cpu or cuda:N")->capture_default_str();
  app.add_option("--kv-type", o->engine.kv_type,
                 "Attention KV cache type: f16, f32, q8_0 or q4_0 (q8_0 / q4_0: head_dim a multiple of 32) "
                 "(default f16 on CUDA, f32 on the CPU)");
  app.add_flag_function(
      "--no-cuda-graph", [o](int64_t) { o->engine.cuda_graphs = false; },
      "CUDA: run every decode step op by op instead of replaying a captured graph");
  ds::cli::add_draft_options(app, o->engine);
  app.add_option("--temp", o->sampling.temperature, "Temperature (0 = greedy)")->capture_default_str();
  app.add_option("--top-k", o->sampling.top_k, "Top-k (0 = off)");
  app.add_option("--top-p", o->sampling.top_p, "Top-p (1 = off)");
  app.add_option("--min-p", o->sampling.min_p, "Min-p (0 = off)");
  app.add_option("--repeat-penalty", o->sampling.repetition_penalty, "Repetition penalty (1 = off)");
  app.add_option("--presence-penalty", o->sampling.presence_penalty, "Presence penalty");
  app.add_option("--frequency-penalty", o->sampling.frequency_penalty, "Frequency penalty");
  app.add_option("--seed", o->sampling.seed, "Sampling seed");
  app.callback([o, &exit_code] { exit_code = ds::cli::report(run(*o)); });
}

ds::cli::Registration reg("run", "Generate from one prompt and print prompt/decode speed", setup);

}  // namespace
