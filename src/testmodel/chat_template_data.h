// The Qwen3.5 / Qwen3.6 chat template embedded in the binary, written into generated GGUF files as
// tokenizer.chat_template. The text lives in chat_template_data.cpp as one raw string literal, kept
// identical to third_party/qwen35_template/chat_template.jinja by a unit test.
#pragma once

namespace ds::testmodel {

// NUL-terminated template text (the .jinja file byte for byte; it contains no NUL).
const char* qwen35_chat_template();

}  // namespace ds::testmodel
