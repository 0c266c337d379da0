// Device limits (ops/cuda/cuda_limits.h) on a real GPU: read bandwidth and BF16 peak in plausible
// ranges, device memory figures consistent, measurements leaving the caching allocator untouched; and
// `deltaserve bench --device cuda:0 --json` end to end on a generated tiny model. Skipped without a
// CUDA build or device (the bad-device checks run in every CUDA build).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#if DS_HAVE_CUDA
#include "model/model.h"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_limits.h"
#endif

namespace ds {
namespace {

#if DS_HAVE_CUDA

namespace fs = std::filesystem;

class CudaLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST(CudaLimitsArgs, MissingDeviceIsInvalidArgument) {
  const int bad = cuda::device_count() + 3;
  auto bw = cuda::measure_read_bandwidth_gbps(bad);
  ASSERT_FALSE(bw.is_ok());
  EXPECT_EQ(bw.status().code(), StatusCode::kInvalidArgument) << bw.status().to_string();
  EXPECT_NE(bw.status().message().find("cuda:" + std::to_string(bad)), std::string::npos) << bw.status().to_string();
  auto peak = cuda::measure_bf16_peak_tflops(-1);
  ASSERT_FALSE(peak.is_ok());
  EXPECT_EQ(peak.status().code(), StatusCode::kInvalidArgument);
  auto used = cuda::device_memory_used(bad);
  ASSERT_FALSE(used.is_ok());
  EXPECT_EQ(used.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CudaLimitsTest, ReadBandwidthIsPlausible) {
  auto bw = cuda::measure_read_bandwidth_gbps(0);
  ASSERT_TRUE(bw.is_ok()) << bw.status().to_string();
  std::printf("read bandwidth: %.1f GB/s\n", *bw);
  EXPECT_GT(*bw, 100.0);     // any datacenter GPU; an H100 reads ~3000 GB/s
  EXPECT_LT(*bw, 20000.0);   // beyond any HBM: the kernel's loads were optimized away or timing is wrong
}

TEST_F(CudaLimitsTest, Bf16PeakIsPlausible) {
  auto tf = cuda::measure_bf16_peak_tflops(0);
  ASSERT_TRUE(tf.is_ok()) << tf.status().to_string();
  std::printf("bf16 peak: %.1f TFLOP/s\n", *tf);
  EXPECT_GT(*tf, 10.0);    // an H100 SXM reaches ~600-750 dense
  EXPECT_LT(*tf, 5000.0);
}

TEST_F(CudaLimitsTest, DeviceMemoryUsedIsConsistent) {
  auto used = cuda::device_memory_used(0);
  ASSERT_TRUE(used.is_ok()) << used.status().to_string();
  auto info = cuda::device_info(0);
  ASSERT_TRUE(info.is_ok());
  EXPECT_GT(used->first, 0);  // at least this process's context
  EXPECT_LE(used->first, used->second);
  EXPECT_GT(used->second, 0);
  EXPECT_LE(used->second, info->total_bytes + (int64_t{1} << 30));
  // A live allocation shows in "used".
  const int64_t bytes = int64_t{256} << 20;
  auto buf = cuda::CudaBuffer::allocate(0, bytes);
  ASSERT_TRUE(buf.is_ok()) << buf.status().to_string();
  auto used2 = cuda::device_memory_used(0);
  ASSERT_TRUE(used2.is_ok());
  EXPECT_GE(used2->first - used->first, bytes - (int64_t{4} << 20)) << used->first << " -> " << used2->first;
}

TEST_F(CudaLimitsTest, MeasurementsLeaveTheAllocatorUntouched) {
  const auto before = cuda::DeviceAllocator::for_device(0).stats();
  ASSERT_TRUE(cuda::measure_read_bandwidth_gbps(0).is_ok());
  ASSERT_TRUE(cuda::measure_bf16_peak_tflops(0).is_ok());
  const auto after = cuda::DeviceAllocator::for_device(0).stats();
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.peak_reserved_bytes, before.peak_reserved_bytes);
  EXPECT_EQ(after.n_device_allocs, before.n_device_allocs);
  EXPECT_TRUE(cuda::device_usable(0));
}

// `deltaserve bench` on cuda:0 as a process: limits, fractions and peak memory in the --json file.
TEST_F(CudaLimitsTest, BenchJsonOnTinyModel) {
  const std::string dir = std::string(DS_BINARY_DIR) + "/cuda_bench_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto run = [&](const std::string& args) {
    const std::string cmd = std::string(DS_EXE) + " " + args + " > " + dir + "/out.txt 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream in(dir + "/out.txt");
    std::stringstream ss;
    ss << in.rdbuf();
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, ss.str());
  };
  const std::string model = dir + "/tiny.gguf";
  auto made = run("make-test-model " + model + " --preset tiny --type q8_0 --quiet");
  ASSERT_EQ(made.first, 0) << made.second;
  const std::string json_path = dir + "/bench.json";
  auto r = run("bench " + model + " --device cuda:0 --pp 64,1500 --tg 8 --depth 0,300 --reps 1 --step-times --json " +
               json_path);
  ASSERT_EQ(r.first, 0) << r.second;
  EXPECT_NE(r.second.find("ms on the device"), std::string::npos) << r.second;  // --step-times
  EXPECT_NE(r.second.find("measured BF16 tensor-core peak"), std::string::npos) << r.second;
  EXPECT_NE(r.second.find("peak device memory"), std::string::npos) << r.second;
  std::ifstream in(json_path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.second;
  SCOPED_TRACE(j.dump(2));
  EXPECT_TRUE(j.value("complete", false));
  EXPECT_EQ(j.value("device", ""), "cuda:0");
  EXPECT_FALSE(j.value("device_name", "").empty());
  EXPECT_EQ(j.value("kv_type", ""), "f16");        // the CUDA default
  const Result<cuda::DeviceInfo> info = cuda::device_info(0);  // auto on CUDA: by the device's memory
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  EXPECT_EQ(j.value("prefill_chunk", int64_t{0}),
            info->total_bytes >= kPrefillChunkCudaLargeMinBytes ? kPrefillChunkCudaLarge : kPrefillChunkCuda);
  EXPECT_GT(j["limits"].value("read_bandwidth_gbps", 0.0), 100.0);
  EXPECT_GT(j["limits"].value("bf16_peak_tflops", 0.0), 10.0);
  EXPECT_GT(j["limits"].value("prefill_bound_tok_s", 0.0), 0.0);
  ASSERT_EQ(j["tests"].size(), 4u);
  for (const auto& t : j["tests"]) {
    EXPECT_GT(t.value("tok_s", 0.0), 0.0) << t.dump();
    EXPECT_GT(t.value("fraction_of_limit", 0.0), 0.0) << t.dump();
  }
  EXPECT_EQ(j["tests"][0].value("limit", ""), "bf16_peak");
  EXPECT_EQ(j["tests"][3].value("limit", ""), "read_bandwidth");
  EXPECT_GT(j["memory"].value("allocator_peak_reserved_bytes", int64_t{0}), 0);
  EXPECT_GE(j["memory"].value("allocator_peak_reserved_bytes", int64_t{0}),
            j["memory"].value("allocator_peak_in_use_bytes", int64_t{0}));
  EXPECT_GE(j["memory"].value("device_used_bytes", int64_t{0}),
            j["memory"].value("allocator_peak_in_use_bytes", int64_t{0}) / 2);
  EXPECT_GT(j["memory"].value("device_total_bytes", int64_t{0}), 0);
  fs::remove_all(dir);
}

#endif  // DS_HAVE_CUDA

}  // namespace
}  // namespace ds
