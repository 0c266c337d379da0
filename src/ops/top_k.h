// The best logits of a step, as a decode step on CUDA can return them instead of the whole row
// (Model::candidates): the kTopKMax largest values, value descending then index ascending. Plain data,
// the same on the host and the device.
#pragma once

#include <cstdint>

namespace ds {

constexpr int kTopKMax = 64;

struct TopKResult {
  int32_t n = 0;  // entries filled (fewer than kTopKMax when fewer values are not NaN); -1: overflow
  int32_t ids[kTopKMax];
  float values[kTopKMax];
};

}  // namespace ds
