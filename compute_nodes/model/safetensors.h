// Safetensors reading (mmap, zero-copy) and writing, with or without a
// `model.safetensors.index.json` shard index.
//
// A TensorStore owns its mappings; TensorView pointers stay valid while the store lives. Reading
// is thread-safe after Open(). Errors (missing file, truncated data, overlapping or out-of-range
// offsets, unknown dtype) are statuses naming the file and tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::model {

enum class DType { kF32, kF16, kBF16 };
size_t DTypeSize(DType d);
std::string_view DTypeName(DType d);

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  int64_t numel() const;
};

float Bf16ToFloat(uint16_t v);
uint16_t FloatToBf16(float f);  // round to nearest even
float F16ToFloat(uint16_t v);

// Converts any supported dtype to fp32.
void ToFloat(const TensorView& t, std::span<float> out);

class TensorStore {
 public:
  // `dir` holds model.safetensors.index.json (shards named there), or one or more *.safetensors.
  static absl::StatusOr<std::unique_ptr<TensorStore>> Open(const std::string& dir);
  ~TensorStore();

  const TensorView* Find(const std::string& name) const;
  // The tensor converted to fp32; InvalidArgument when absent or its shape differs.
  absl::StatusOr<std::vector<float>> LoadFloat(const std::string& name,
                                               std::span<const int64_t> shape) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

 private:
  struct Mapping;
  absl::Status MapFile(const std::string& path);
  std::vector<std::unique_ptr<Mapping>> mappings_;
  std::map<std::string, TensorView> tensors_;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // little-endian, row-major
};

// Writes one safetensors file (tensors sorted by name, header padded to 8 bytes).
absl::Status WriteSafetensors(const std::string& path, const std::vector<const TensorToWrite*>& ts);

// Writes `tensors` into `dir`: one model.safetensors when the total is at most `shard_bytes`, else
// model-0000i-of-0000n.safetensors shards plus model.safetensors.index.json.
absl::Status WriteCheckpointTensors(const std::string& dir, const std::vector<TensorToWrite>& ts,
                                    size_t shard_bytes);

}  // namespace strata::model
