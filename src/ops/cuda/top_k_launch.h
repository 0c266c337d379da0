// The best logits of a row on the device (ops/cuda/top_k.cu): a decode step whose sampling needs only
// its best logits (greedy, top-k up to kTopKMax without penalties) copies a TopKResult back instead
// of the whole row. Needs the CUDA runtime headers: include only under DS_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/top_k.h"

namespace ds::cuda {

constexpr int kTopKBlock = 128;             // values per block maximum
constexpr int kTopKMaxBlocks = 4096;        // rows of up to 524288 values
constexpr int kTopKMaxCandidates = 8192;    // values at least the threshold, sorted in one CTA

// Rows top_k_launch takes: 1 to kTopKMaxBlocks * kTopKBlock values.
bool top_k_fits(int64_t n);
// Floats of device scratch top_k_launch needs for a row of n (its block maxima).
int64_t top_k_scratch_floats(int64_t n);
// out = the kTopKMax largest of x[0, n) (value descending, index ascending; NaN never taken), or
// out->n = -1 when more than kTopKMaxCandidates values tie at the threshold. Two launches on s.
cudaError_t top_k_launch(const float* x, int64_t n, float* scratch, TopKResult* out, cudaStream_t s);

}  // namespace ds::cuda
