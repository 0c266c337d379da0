// The embedded chat template must equal third_party/qwen35_template/chat_template.jinja byte for byte.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "testmodel/chat_template_data.h"

namespace ds::testmodel {
namespace {

TEST(TestModelTemplate, MatchesJinjaFileByteForByte) {
  const std::string path = std::string(DS_SOURCE_DIR) + "/third_party/qwen35_template/chat_template.jinja";
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string file = ss.str();
  const std::string embedded = qwen35_chat_template();
  ASSERT_FALSE(file.empty());
  EXPECT_EQ(embedded.size(), file.size());
  EXPECT_TRUE(embedded == file) << "chat_template_data.cpp has drifted from " << path;
}

}  // namespace
}  // namespace ds::testmodel
