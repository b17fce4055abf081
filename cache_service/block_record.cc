#include "cache_service/block_record.h"

#include <cstring>

#include "common/strings.h"

namespace strata::cache {
namespace {

constexpr uint8_t kRecordVersion = 1;
constexpr uint32_t kNoSlot = UINT32_MAX;

template <typename T>
void Put(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(buf, sizeof(T));
}

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (in_.size() < sizeof(T)) return false;
    std::memcpy(v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetBytes(std::string_view* v, size_t n) {
    if (in_.size() < n) return false;
    *v = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }

 private:
  std::string_view in_;
};

}  // namespace

std::string EncodeBlockRecord(const BlockRecord& r) {
  std::string out;
  out.reserve(128 + r.tenant.size());
  Put<uint8_t>(out, kRecordVersion);
  out.append(r.parent.View());
  out.append(r.ns.View());
  Put<uint32_t>(out, static_cast<uint32_t>(r.tenant.size()));
  out.append(r.tenant);
  Put<uint64_t>(out, r.payload_bytes);
  Put<uint64_t>(out, r.checksum);
  Put<uint32_t>(out, r.dram_slot.value_or(kNoSlot));
  Put<uint32_t>(out, r.ssd_slot.value_or(kNoSlot));
  Put<int64_t>(out, r.created_ms);
  Put<int64_t>(out, r.last_access_ms);
  Put<uint64_t>(out, r.hits);
  Put<uint8_t>(out, static_cast<uint8_t>(r.pin));
  Put<int64_t>(out, r.pin_expires_ms);
  return out;
}

absl::StatusOr<BlockRecord> DecodeBlockRecord(const BlockKey& key, std::string_view bytes) {
  BlockRecord r;
  r.key = key;
  Reader in(bytes);
  uint8_t version = 0;
  std::string_view parent, ns, tenant;
  uint32_t tenant_len = 0, dram = 0, ssd = 0;
  uint8_t pin = 0;
  const bool ok = in.Get(&version) && version == kRecordVersion &&
                  in.GetBytes(&parent, r.parent.bytes.size()) &&
                  in.GetBytes(&ns, r.ns.bytes.size()) && in.Get(&tenant_len) &&
                  in.GetBytes(&tenant, tenant_len) && in.Get(&r.payload_bytes) &&
                  in.Get(&r.checksum) && in.Get(&dram) && in.Get(&ssd) && in.Get(&r.created_ms) &&
                  in.Get(&r.last_access_ms) && in.Get(&r.hits) && in.Get(&pin) &&
                  in.Get(&r.pin_expires_ms) && pin <= 2;
  if (!ok) {
    return absl::DataLossError(StrCat("index record of block ", key.Hex(), " is malformed"));
  }
  std::memcpy(r.parent.bytes.data(), parent.data(), parent.size());
  std::memcpy(r.ns.bytes.data(), ns.data(), ns.size());
  r.tenant = std::string(tenant);
  if (dram != kNoSlot) r.dram_slot = dram;
  if (ssd != kNoSlot) r.ssd_slot = ssd;
  r.pin = static_cast<PinKind>(pin);
  return r;
}

}  // namespace strata::cache
