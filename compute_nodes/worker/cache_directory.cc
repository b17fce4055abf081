#include "compute_nodes/worker/cache_directory.h"

#include "spdlog/spdlog.h"

namespace strata::worker {

CacheDirectory::CacheDirectory(cache_client::CacheClientOptions local,
                               absl::Duration retry_interval)
    : local_(std::move(local)), retry_interval_(retry_interval) {}

cache_client::CacheClient* CacheDirectory::Get(const std::string& address) {
  const std::string& addr = address.empty() ? local_.address : address;
  if (addr.empty()) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[addr];
  if (e.client != nullptr) return e.client.get();
  const absl::Time now = absl::Now();
  if (now - e.last_attempt < retry_interval_) return nullptr;
  e.last_attempt = now;
  cache_client::CacheClientOptions options = local_;
  options.address = addr;
  auto client = cache_client::CacheClient::Connect(options);
  if (!client.ok()) {
    spdlog::warn("cache server {} unreachable: {}", addr, client.status().ToString());
    return nullptr;
  }
  e.client = std::move(*client);
  return e.client.get();
}

void CacheDirectory::FlushSaves() {
  std::vector<cache_client::CacheClient*> clients;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [address, e] : entries_) {
      if (e.client != nullptr) clients.push_back(e.client.get());
    }
  }
  for (cache_client::CacheClient* c : clients) c->FlushSaves();
}

}  // namespace strata::worker
