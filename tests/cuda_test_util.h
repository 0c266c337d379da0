// The device side of the CUDA op tests: a fixture base that skips without a CUDA device, owns a stream
// and an OpContext on cuda:0, and keeps every device buffer it hands out alive until the test ends.
// Test fixtures derive from it and add what is particular to them (misaligned copies, raw pointers).
#pragma once

#if DS_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "ops/cuda/cuda_device.h"
#include "ops/cuda/pdl.h"
#include "ops_test_util.h"

namespace ds::test {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    auto s = cuda::Stream::create(0);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    stream_ = std::move(*s);
    ctx_.device = Device{DeviceKind::kCuda, 0};
    ctx_.cuda_stream = stream_.handle();
  }

  // `bytes` of device memory (at least 16), kept alive by the fixture.
  void* dev(int64_t bytes) {
    auto b = cuda::CudaBuffer::allocate(0, std::max<int64_t>(bytes, 16));
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    void* p = b->data();
    bufs_.push_back(std::move(*b));
    return p;
  }
  // A device copy of `bytes` host bytes, viewed like `like` (its shape, type and strides).
  TensorView up(const TensorView& like, const void* host, int64_t bytes) {
    void* d = dev(bytes);
    EXPECT_TRUE(cuda::copy_to_device(d, host, bytes, stream_).is_ok());
    TensorView t = like;
    t.data = d;
    t.device = ctx_.device;
    return t;
  }
  // A device copy of a host tensor (`bytes` of it; all of it when negative).
  TensorView up(const TensorView& h, int64_t bytes = -1) { return up(h, h.data, bytes < 0 ? h.n_bytes() : bytes); }
  TensorView up(const Host& h) { return up(h.t, h.v.data(), static_cast<int64_t>(4 * h.v.size())); }
  // n floats of d (all of d when omitted), once the stream's work is done.
  std::vector<float> down(const TensorView& d, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n));
    EXPECT_TRUE(cuda::copy_to_host(out.data(), d.data, 4 * n, stream_).is_ok());
    const Status s = stream_.synchronize();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return out;
  }
  std::vector<float> down(const TensorView& d) { return down(d, d.n_elements()); }

  // Captures what `step` launches on the fixture's stream into *exec (graph and executable destroyed
  // when the test ends): the step must succeed inside the capture and the capture must end cleanly.
  // Call through ASSERT_NO_FATAL_FAILURE.
  void capture(const std::function<Status()>& step, cudaGraphExec_t* exec,
               cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
    const auto cs = static_cast<cudaStream_t>(stream_.handle());
    ASSERT_EQ(cudaStreamBeginCapture(cs, mode), cudaSuccess);
    const Status s = step();
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(cs, &graph);
    ASSERT_TRUE(s.is_ok()) << "during capture: " << s.to_string();
    ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
    graphs_.push_back(graph);
    ASSERT_EQ(cudaGraphInstantiate(exec, graph, 0), cudaSuccess);
    execs_.push_back(*exec);
  }
  void TearDown() override {
    for (cudaGraphExec_t e : execs_) EXPECT_EQ(cudaGraphExecDestroy(e), cudaSuccess);
    for (cudaGraph_t g : graphs_) EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
  }

  cuda::Stream stream_;
  OpContext ctx_;
  std::vector<cuda::CudaBuffer> bufs_;
  std::vector<cudaGraph_t> graphs_;
  std::vector<cudaGraphExec_t> execs_;
};

// Caps the shared memory a CTA may opt into (cuda::set_smem_optin_cap) for its lifetime, so a test on
// a large GPU takes the paths of a smaller one (99 KB: sm_86 / sm_89); no cap again when it ends.
struct SmemOptinCap {
  explicit SmemOptinCap(long long bytes) { cuda::set_smem_optin_cap(bytes); }
  ~SmemOptinCap() { cuda::set_smem_optin_cap(0); }
  SmemOptinCap(const SmemOptinCap&) = delete;
  SmemOptinCap& operator=(const SmemOptinCap&) = delete;
};

}  // namespace ds::test

#endif  // DS_HAVE_CUDA
