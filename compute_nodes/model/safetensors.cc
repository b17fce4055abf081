#include "compute_nodes/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/file_util.h"
#include "common/status.h"
#include "common/strings.h"

namespace strata::model {

using nlohmann::json;
namespace fs = std::filesystem;

size_t DTypeSize(DType d) { return d == DType::kF32 ? 4 : 2; }
std::string_view DTypeName(DType d) {
  switch (d) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

float Bf16ToFloat(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void ToFloat(const TensorView& t, std::span<float> out) {
  const int64_t n = t.numel();
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(out.data(), t.data, n * 4);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, t.data + 2 * i, 2);
        out[i] = Bf16ToFloat(v);
      }
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, t.data + 2 * i, 2);
        out[i] = F16ToFloat(v);
      }
      return;
  }
}

struct TensorStore::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr != nullptr && addr != MAP_FAILED) munmap(addr, size);
  }
};

TensorStore::~TensorStore() = default;

absl::Status TensorStore::MapFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(StrCat("cannot open ", path, ": ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(StrCat("fstat ", path));
  }
  auto m = std::make_unique<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(StrCat(path, ": too short for a safetensors file"));
  }
  m->addr = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m->addr == MAP_FAILED) return absl::InternalError(StrCat("mmap ", path));
  const auto* base = static_cast<const uint8_t*>(m->addr);
  uint64_t header_len;
  std::memcpy(&header_len, base, 8);
  if (header_len > m->size - 8) {
    return absl::InvalidArgumentError(StrCat(path, ": header length past the end of the file"));
  }
  json header = json::parse(base + 8, base + 8 + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(StrCat(path, ": header is not a JSON object"));
  }
  const uint8_t* data = base + 8 + header_len;
  const size_t data_size = m->size - 8 - header_len;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    TensorView t;
    const std::string dtype = info.value("dtype", "");
    if (dtype == "F32") {
      t.dtype = DType::kF32;
    } else if (dtype == "BF16") {
      t.dtype = DType::kBF16;
    } else if (dtype == "F16") {
      t.dtype = DType::kF16;
    } else {
      return absl::InvalidArgumentError(
          StrCat(path, ": tensor ", name, ": unsupported dtype '", dtype, "'"));
    }
    if (!info.contains("shape") || !info.contains("data_offsets")) {
      return absl::InvalidArgumentError(StrCat(path, ": tensor ", name, ": malformed entry"));
    }
    t.shape = info["shape"].get<std::vector<int64_t>>();
    auto off = info["data_offsets"].get<std::vector<uint64_t>>();
    if (off.size() != 2 || off[0] > off[1] || off[1] > data_size ||
        off[1] - off[0] != static_cast<uint64_t>(t.numel()) * DTypeSize(t.dtype)) {
      return absl::InvalidArgumentError(
          StrCat(path, ": tensor ", name, ": data offsets do not match its shape or the file"));
    }
    t.data = data + off[0];
    t.bytes = off[1] - off[0];
    if (!tensors_.emplace(name, std::move(t)).second) {
      return absl::InvalidArgumentError(StrCat(path, ": tensor ", name, " appears twice"));
    }
  }
  mappings_.push_back(std::move(m));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TensorStore>> TensorStore::Open(const std::string& dir) {
  auto store = std::unique_ptr<TensorStore>(new TensorStore());
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::set<std::string> files;
  if (fs::exists(index)) {
    ASSIGN_OR_RETURN(const std::string index_text, ReadFile(index.string()));
    json j = json::parse(index_text, nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return absl::InvalidArgumentError(StrCat(index.string(), ": no weight_map"));
    }
    for (auto& [name, file] : j["weight_map"].items()) files.insert(file.get<std::string>());
  } else {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".safetensors") files.insert(e.path().filename().string());
    }
    if (ec) return absl::NotFoundError(StrCat("cannot list ", dir, ": ", ec.message()));
  }
  if (files.empty()) return absl::NotFoundError(StrCat(dir, ": no *.safetensors files"));
  for (const auto& f : files) RETURN_IF_ERROR(store->MapFile((fs::path(dir) / f).string()));
  return store;
}

const TensorView* TensorStore::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::vector<float>> TensorStore::LoadFloat(const std::string& name,
                                                          std::span<const int64_t> shape) const {
  const TensorView* t = Find(name);
  if (t == nullptr) return absl::InvalidArgumentError(StrCat("missing tensor ", name));
  if (!std::equal(shape.begin(), shape.end(), t->shape.begin(), t->shape.end())) {
    return absl::InvalidArgumentError(StrCat("tensor ", name, " has shape [",
                                             StrJoin(t->shape, ","), "], expected [",
                                             StrJoin(shape, ","), "]"));
  }
  std::vector<float> out(t->numel());
  ToFloat(*t, out);
  return out;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<const TensorToWrite*>& ts) {
  std::vector<const TensorToWrite*> sorted = ts;
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const TensorToWrite* t : sorted) {
    header[t->name] = {{"dtype", std::string(DTypeName(t->dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->data.size()}}};
    offset += t->data.size();
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(StrCat("cannot create ", path));
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), h.size());
  for (const TensorToWrite* t : sorted) {
    out.write(reinterpret_cast<const char*>(t->data.data()), t->data.size());
  }
  out.close();
  if (!out) return absl::InternalError(StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

absl::Status WriteCheckpointTensors(const std::string& dir, const std::vector<TensorToWrite>& ts,
                                    size_t shard_bytes) {
  size_t total = 0;
  for (const auto& t : ts) total += t.data.size();
  if (total <= shard_bytes) {
    std::vector<const TensorToWrite*> all;
    for (const auto& t : ts) all.push_back(&t);
    return WriteSafetensors((fs::path(dir) / "model.safetensors").string(), all);
  }
  std::vector<std::vector<const TensorToWrite*>> shards(1);
  size_t in_shard = 0;
  for (const auto& t : ts) {
    if (in_shard > 0 && in_shard + t.data.size() > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += t.data.size();
  }
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    RETURN_IF_ERROR(WriteSafetensors((fs::path(dir) / name).string(), shards[i]));
    for (const TensorToWrite* t : shards[i]) weight_map[t->name] = name;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream out(fs::path(dir) / "model.safetensors.index.json", std::ios::trunc);
  out << index.dump(2) << "\n";
  out.close();
  if (!out) return absl::InternalError(StrCat("writing the index in ", dir, " failed"));
  return absl::OkStatus();
}

}  // namespace strata::model
