#include "compute_nodes/runtime/kv_pool.h"

#include <algorithm>
#include <cstring>

#include "common/block_format.h"
#include "common/parallel_copy.h"
#include "common/strings.h"
#include "compute_nodes/model/safetensors.h"

namespace strata::runtime {

KvPool::KvPool(KvLayout layout, int64_t num_pages)
    : layout_(layout), num_pages_(num_pages), in_use_(num_pages, false) {
  free_.reserve(num_pages);
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

HostKvPool::HostKvPool(KvLayout layout, int64_t num_pages, KvPrecision precision)
    : KvPool(layout, num_pages),
      precision_(precision),
      storage_(static_cast<size_t>(num_pages * layout.floats_per_page()), 0.0f) {}

int64_t KvPool::free_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_.size());
}

absl::StatusOr<int32_t> KvPool::Allocate() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) {
    return absl::ResourceExhaustedError(StrCat("KV pool: all ", num_pages_, " pages in use"));
  }
  const int32_t p = free_.back();
  free_.pop_back();
  in_use_[p] = true;
  return p;
}

void KvPool::Free(int32_t page) {
  std::lock_guard<std::mutex> lock(mu_);
  if (page < 0 || page >= num_pages_ || !in_use_[page]) return;
  in_use_[page] = false;
  free_.push_back(page);
}

float* HostKvPool::Latent(int32_t page, int64_t layer) {
  return storage_.data() + page * layout().floats_per_page() + layer * layout().floats_per_layer();
}
float* HostKvPool::KPe(int32_t page, int64_t layer) {
  return Latent(page, layer) + layout().block_tokens * layout().latent_dim;
}
const float* HostKvPool::Latent(int32_t page, int64_t layer) const {
  return storage_.data() + page * layout().floats_per_page() + layer * layout().floats_per_layer();
}
const float* HostKvPool::KPe(int32_t page, int64_t layer) const {
  return Latent(page, layer) + layout().block_tokens * layout().latent_dim;
}

size_t KvPool::PayloadBytes(PayloadDtype dtype) const {
  const KvLayout& l = layout();
  switch (dtype) {
    case PayloadDtype::kF32:
      return static_cast<size_t>(l.floats_per_page()) * 4;
    case PayloadDtype::kBf16:
      return static_cast<size_t>(l.floats_per_page()) * 2;
    case PayloadDtype::kFp8E4M3:
      return static_cast<size_t>(
          l.num_layers * l.block_tokens *
          (l.latent_dim + 4 * (l.latent_dim / kFp8GroupSize) + 2 * l.rope_dim));
  }
  return 0;
}

absl::Status KvPool::CheckPage(int32_t page) const {
  if (page < 0 || page >= num_pages_) {
    return absl::InvalidArgumentError(StrCat("KV pool: page ", page, " out of range"));
  }
  return absl::OkStatus();
}

absl::Status KvPool::CheckPayload(PayloadDtype dtype, size_t bytes) const {
  if (dtype == PayloadDtype::kFp8E4M3 && layout().latent_dim % kFp8GroupSize != 0) {
    return absl::InvalidArgumentError(
        StrCat("KV pool: fp8 payloads need a latent dim that is a "
               "multiple of ",
               kFp8GroupSize, ", not ", layout().latent_dim));
  }
  if (bytes != PayloadBytes(dtype)) {
    return absl::InvalidArgumentError(
        StrCat("KV pool: payload of ", bytes, " bytes, expected ", PayloadBytes(dtype)));
  }
  return absl::OkStatus();
}

void HostKvPool::StoreRow(int32_t page, int64_t layer, int64_t slot, const float* latent,
                          const float* k_pe) {
  float* dl = Latent(page, layer) + slot * layout().latent_dim;
  float* dk = KPe(page, layer) + slot * layout().rope_dim;
  std::copy_n(latent, layout().latent_dim, dl);
  std::copy_n(k_pe, layout().rope_dim, dk);
  if (precision_ == KvPrecision::kBf16) {
    for (int64_t i = 0; i < layout().latent_dim; ++i) {
      dl[i] = model::Bf16ToFloat(model::FloatToBf16(dl[i]));
    }
    for (int64_t i = 0; i < layout().rope_dim; ++i) {
      dk[i] = model::Bf16ToFloat(model::FloatToBf16(dk[i]));
    }
  }
}

namespace {

// Element-wise through the block format's (inline, vectorizable) bf16 conversions; payload bytes
// may be unaligned, hence the memcpys.
void ToBf16(const float* src, int64_t n, uint8_t* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = Fp32ToBf16(src[i]);
    std::memcpy(dst + 2 * i, &b, 2);
  }
}

void RoundToBf16(float* v, int64_t n) {  // in place
  for (int64_t i = 0; i < n; ++i) v[i] = Bf16ToFp32(Fp32ToBf16(v[i]));
}

void FromBf16(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, src + 2 * i, 2);
    dst[i] = Bf16ToFp32(b);
  }
}

// One layer's fp8 payload (block_format.h): codes [B][R], scales [B][R/128] f32, k_pe bf16 [B][P].
struct Fp8Layer {
  int64_t codes, scales, kpe;  // element counts
  int64_t bytes() const { return codes + 4 * scales + 2 * kpe; }
};

Fp8Layer Fp8LayerOf(const KvLayout& l) {
  return {l.block_tokens * l.latent_dim, l.block_tokens * (l.latent_dim / kFp8GroupSize),
          l.block_tokens * l.rope_dim};
}

}  // namespace

// The page already has the payload's layer-major layout, so bf16 and fp32 convert element-wise;
// fp8 quantizes each layer's latent and converts its k_pe.
absl::Status HostKvPool::ExportPageInto(int32_t page, PayloadDtype dtype,
                                        std::span<uint8_t> out) const {
  if (auto st = CheckPage(page); !st.ok()) return st;
  if (auto st = CheckPayload(dtype, out.size()); !st.ok()) return st;
  const float* src = storage_.data() + page * layout().floats_per_page();
  const int64_t n = layout().floats_per_page();
  switch (dtype) {
    case PayloadDtype::kF32:
      std::memcpy(out.data(), src, n * 4);
      break;
    case PayloadDtype::kBf16:
      ToBf16(src, n, out.data());
      break;
    case PayloadDtype::kFp8E4M3: {
      const Fp8Layer f = Fp8LayerOf(layout());
      std::vector<float> scales(f.scales);
      for (int64_t l = 0; l < layout().num_layers; ++l) {
        uint8_t* at = out.data() + l * f.bytes();
        if (absl::Status st = QuantizeFp8E4M3(std::span<const float>(Latent(page, l), f.codes),
                                              std::span<uint8_t>(at, f.codes), scales);
            !st.ok()) {
          return absl::InvalidArgumentError(
              StrCat("KV pool: fp8 export of page ", page, " layer ", l, ": ", st.message()));
        }
        std::memcpy(at + f.codes, scales.data(), 4 * f.scales);
        ToBf16(KPe(page, l), f.kpe, at + f.codes + 4 * f.scales);
      }
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status HostKvPool::ImportPage(int32_t page, PayloadDtype dtype,
                                    std::span<const uint8_t> payload) {
  if (auto st = CheckPage(page); !st.ok()) return st;
  if (auto st = CheckPayload(dtype, payload.size()); !st.ok()) return st;
  float* dst = storage_.data() + page * layout().floats_per_page();
  const int64_t n = layout().floats_per_page();
  switch (dtype) {
    case PayloadDtype::kF32:
      std::memcpy(dst, payload.data(), n * 4);
      break;
    case PayloadDtype::kBf16:
      FromBf16(payload.data(), n, dst);
      break;
    case PayloadDtype::kFp8E4M3: {
      const Fp8Layer f = Fp8LayerOf(layout());
      std::vector<float> scales(f.scales);
      for (int64_t l = 0; l < layout().num_layers; ++l) {
        const uint8_t* at = payload.data() + l * f.bytes();
        std::memcpy(scales.data(), at + f.codes, 4 * f.scales);
        float* latent = Latent(page, l);
        DequantizeFp8E4M3(std::span<const uint8_t>(at, f.codes), scales,
                          std::span<float>(latent, f.codes));
        if (precision_ == KvPrecision::kBf16) RoundToBf16(latent, f.codes);  // as the GPU's pages
        FromBf16(at + f.codes + 4 * f.scales, f.kpe, KPe(page, l));
      }
      break;
    }
  }
  return absl::OkStatus();
}

namespace {

// move(i) for every page i: on up to 8 threads when the pages are distinct (a repeated page is
// moved in order, so the last payload wins as it would one at a time). *done counts the moves
// before the first that failed, whose status is returned.
template <typename Move>
absl::Status MovePages(std::span<const int32_t> pages, size_t bytes_each, int64_t* done,
                       const Move& move) {
  std::vector<int32_t> sorted(pages.begin(), pages.end());
  std::sort(sorted.begin(), sorted.end());
  const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
  const auto n = static_cast<int64_t>(pages.size());
  std::vector<absl::Status> status(pages.size());
  if (distinct) {
    ForEachCopy(n, n * static_cast<int64_t>(bytes_each), [&](int64_t i) { status[i] = move(i); });
  } else {
    for (int64_t i = 0; i < n && (i == 0 || status[i - 1].ok()); ++i) status[i] = move(i);
  }
  for (const absl::Status& st : status) {
    if (!st.ok()) return st;
    ++*done;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status KvPool::ImportPages(std::span<const int32_t> pages, PayloadDtype dtype,
                                 std::span<const std::span<const uint8_t>> payloads,
                                 int64_t* done) {
  *done = 0;
  if (auto st = CheckMoves("ImportPages", pages, dtype, payloads); !st.ok()) return st;
  return MovePages(pages, PayloadBytes(dtype), done,
                   [&](int64_t i) { return ImportPage(pages[i], dtype, payloads[i]); });
}

absl::Status KvPool::ExportPagesInto(std::span<const int32_t> pages, PayloadDtype dtype,
                                     std::span<const std::span<uint8_t>> outs,
                                     int64_t* done) const {
  *done = 0;
  if (auto st = CheckMoves("ExportPagesInto", pages, dtype, outs); !st.ok()) return st;
  return MovePages(pages, PayloadBytes(dtype), done,
                   [&](int64_t i) { return ExportPageInto(pages[i], dtype, outs[i]); });
}

absl::Status KvPool::ExportPage(int32_t page, PayloadDtype dtype,
                                std::vector<uint8_t>* payload) const {
  payload->resize(PayloadBytes(dtype));
  return ExportPageInto(page, dtype, *payload);
}

absl::Status KvPool::ExportPages(std::span<const int32_t> pages, PayloadDtype dtype,
                                 std::vector<std::vector<uint8_t>>* payloads, int64_t* done) const {
  *done = 0;
  for (const int32_t page : pages) {
    if (auto st = CheckPage(page); !st.ok()) return st;
  }
  payloads->resize(pages.size());
  std::vector<std::span<uint8_t>> outs;
  outs.reserve(pages.size());
  for (std::vector<uint8_t>& p : *payloads) {
    p.resize(PayloadBytes(dtype));
    outs.emplace_back(p);
  }
  return ExportPagesInto(pages, dtype, outs, done);
}

absl::StatusOr<std::shared_ptr<HostBuffer>> KvPool::AllocateHostBuffer(size_t bytes) const {
  return HostBuffer::Allocate(bytes);
}

absl::Status EnsureCapacity(KvPool& pool, PageTable& table, int64_t tokens) {
  const int64_t b = pool.layout().block_tokens;
  const int64_t need = (tokens + b - 1) / b;
  std::vector<int32_t> added;
  while (static_cast<int64_t>(table.pages.size() + added.size()) < need) {
    auto page = pool.Allocate();
    if (!page.ok()) {
      for (int32_t p : added) pool.Free(p);
      return page.status();
    }
    added.push_back(*page);
  }
  table.pages.insert(table.pages.end(), added.begin(), added.end());
  return absl::OkStatus();
}

void ReleasePages(KvPool& pool, PageTable& table) {
  for (int32_t p : table.pages) pool.Free(p);
  table.pages.clear();
}

}  // namespace strata::runtime
