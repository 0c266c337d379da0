// Tokenizer::from_gguf: reads the tokenizer.ggml.* keys of a GGUF file into a TokenizerVocab.
// Kept in its own file so that users of the tokenizer that never read GGUF do not link the reader.
#include "gguf/gguf.h"
#include "text/tokenizer.h"

namespace ds {

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& file) {
  TokenizerVocab vocab;
  vocab.source = file.name();
  DS_ASSIGN_OR_RETURN(std::string model, file.get_string("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return unsupported("{}: tokenizer.ggml.model is '{}', expected 'gpt2' (byte-level BPE)", file.name(), model);
  }
  DS_ASSIGN_OR_RETURN(auto tokens, file.get_string_array("tokenizer.ggml.tokens"));
  vocab.tokens.assign(tokens.begin(), tokens.end());
  if (file.has("tokenizer.ggml.token_type")) {
    DS_ASSIGN_OR_RETURN(vocab.token_types, file.get_i32_array("tokenizer.ggml.token_type"));
  }
  if (!file.has("tokenizer.ggml.merges")) {
    return not_found("{}: cannot find tokenizer merges (tokenizer.ggml.merges)", file.name());
  }
  DS_ASSIGN_OR_RETURN(auto merges, file.get_string_array("tokenizer.ggml.merges"));
  vocab.merges.assign(merges.begin(), merges.end());
  struct IdKey {
    const char* key;
    int64_t* out;
  };
  for (IdKey k : {IdKey{"tokenizer.ggml.bos_token_id", &vocab.bos_id}, IdKey{"tokenizer.ggml.eos_token_id", &vocab.eos_id},
                  IdKey{"tokenizer.ggml.padding_token_id", &vocab.pad_id}}) {
    if (!file.has(k.key)) continue;
    DS_ASSIGN_OR_RETURN(*k.out, file.get_int(k.key));
  }
  if (file.has("tokenizer.ggml.pre")) {
    DS_ASSIGN_OR_RETURN(vocab.pre, file.get_string("tokenizer.ggml.pre"));
  }
  return from_vocab(std::move(vocab));
}

}  // namespace ds
