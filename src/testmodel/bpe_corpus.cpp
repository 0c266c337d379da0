// The built-in BPE training corpus of generated test models: original English prose, a little
// source code, and CJK and emoji text, so that the learned merges cover words, code punctuation and
// multi-byte UTF-8. Changing this text changes every generated vocabulary (and the demo model).
#include "testmodel/bpe_vocab.h"

namespace ds::testmodel {

std::string_view bpe_training_corpus() {
  static constexpr std::string_view kCorpus = R"CORPUS(The morning train left the station a little after seven. Most of the passengers were
reading, some were sleeping, and a few were looking out of the window at the fields, which were
still grey with frost. The conductor walked slowly along the corridor and checked every ticket.
When the train reached the river, the sun came out, and the water turned from grey to silver.

A language model reads a prompt one token at a time and predicts the next token. The server keeps
the state of every sequence, so that a long conversation does not have to be processed again from
the beginning when the user sends another message. This is called prefix caching, and it matters
most for coding agents, which send the same long instructions with every request.

The weather report for the weekend: clouds in the north, rain in the west, and sunshine along the
coast. Temperatures will rise slowly during the week. Farmers are hoping for a dry autumn, because
the harvest was late this year and the apples are still on the trees.

She opened the old notebook and found a list of questions written in pencil. What is the shortest
path between two cities? How many colours does a map need? Why does the kettle sing before the water
boils? Some of the answers were there as well, in a different hand, with dates and small drawings.

Good documentation explains what a function does, what it expects, and what it returns. It also
says what happens when something goes wrong: a missing file, a value out of range, a network that
does not answer. Tests check that the code keeps these promises, today and after every change.

#include <cstdio>
#include <vector>

// Returns the sum of the values in the list.
int sum_values(const std::vector<int>& values) {
  int total = 0;
  for (int value : values) {
    total += value;
  }
  return total;
}

int main(int argc, char** argv) {
  std::vector<int> numbers = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::printf("sum = %d\n", sum_values(numbers));
  return 0;
}

def read_config(path):
    """Reads a key = value file and returns a dictionary."""
    config = {}
    with open(path, "r", encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config

for (let i = 0; i < items.length; i++) {
  if (items[i].done) {
    console.log(`item ${i} is done`);
  }
}

SELECT name, count(*) AS total FROM orders WHERE status = 'open' GROUP BY name ORDER BY total DESC;

{"model": "test", "messages": [{"role": "user", "content": "Hello, how are you?"}], "stream": true}

今天天气很好，我们去公园散步吧。这个模型可以回答问题，也可以写代码。
我喜欢在早上喝一杯茶，然后开始工作。学习一种新的语言需要时间和耐心。
東京の朝はとても静かです。私は毎日電車で会社に行きます。猫が窓のそばで寝ています。
これはテスト用の小さなモデルです。日本語と中国語の文章も少し含まれています。
오늘은 날씨가 맑습니다. 우리는 도서관에서 책을 읽었습니다.

Emoji and symbols: 🙂 😀 🎉 🚀 ✅ ❤️ 🌧️ ☀️ 🍎 📚 — “quotes”, ‘single’, café, naïve, déjà vu, Straße, 10 °C, 5 €.

The library opens at nine and closes at six. On Sundays it is closed, except in December, when it
stays open until noon so that people can return their books before the holidays. The children's
room is on the first floor, next to the reading room, where it is always quiet.

Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 16 24 32 64 128 256 512 1024 2048 4096 3.14159 2.71828 1e-6.
)CORPUS";
  return kCorpus;
}

}  // namespace ds::testmodel
