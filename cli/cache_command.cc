// strata cache [--config FILE] [--set key=value]... [--ready-file PATH]
//
// The cache server daemon: serves CacheControl and CacheAdmin over gRPC, /metrics and /healthz
// over HTTP, until SIGINT or SIGTERM.
#include <signal.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include "cache_service/cache_server.h"
#include "cli/commands.h"
#include "cli/daemon.h"
#include "cli/strata_config.h"
#include "common/file_util.h"
#include "common/strings.h"
#include "spdlog/spdlog.h"

namespace strata::cli {
namespace {

// An unset path means "not configured" (an empty secret), not an error.
absl::StatusOr<std::string> ReadOptionalSecret(const std::string& path, std::string_view what) {
  if (path.empty()) return std::string();
  return ReadSecretFile(path, what);
}

absl::StatusOr<cache::CacheServerOptions> ToServerOptions(const StrataConfig& config) {
  const CacheSection& c = config.cache;
  cache::CacheServerOptions o;
  o.listen = c.listen;
  o.http_listen = c.http_listen;
  o.host_id = c.host_id;
  o.digest_interval = c.digest_interval;
  o.transfer_listen = c.transfer_listen;
  o.shm_socket_path = c.shm_socket;
  o.enable_rdma = config.transfer.rdma_enable;
  o.rdma_qp_count = static_cast<uint32_t>(config.transfer.rdma_qps_per_peer);
  auto secret = ReadOptionalSecret(config.cluster.secret_file, "cluster secret");
  if (!secret.ok()) return secret.status();
  o.cluster_secret = *secret;
  auto token = ReadOptionalSecret(config.cluster.admin_token_file, "admin token");
  if (!token.ok()) return token.status();
  o.admin_token = *token;
  cache::StoreOptions& s = o.store;
  s.server_id = c.server_id;
  s.data_dir = c.data_dir;
  s.slot_bytes = c.slot_bytes;
  s.dram_capacity_bytes = c.dram_capacity;
  s.dram_max_bytes = c.dram_max;
  s.dram_prefault = c.dram_prefault;
  s.dram_high_watermark = c.dram_high_watermark;
  s.dram_low_watermark = c.dram_low_watermark;
  s.ssd_dir = c.ssd_dir;
  s.ssd_capacity_bytes = c.ssd_capacity;
  s.ssd_max_bytes = c.ssd_max;
  s.ssd_slots_per_file = static_cast<uint32_t>(c.ssd_slots_per_file);
  s.ssd_high_watermark = c.ssd_high_watermark;
  s.ssd_low_watermark = c.ssd_low_watermark;
  auto policy = cache::ParseWritePolicy(c.write_policy);
  if (!policy.ok()) return policy.status();
  s.write_policy = *policy;
  s.lease_ttl = c.lease_ttl;
  s.event_capacity = static_cast<size_t>(c.event_log);
  for (const std::string& q : c.tenant_quotas) {
    const size_t eq = q.rfind('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          StrCat("cache.tenant_quotas: '", q, "' is not tenant=size"));
    }
    auto bytes = ParseBytes(std::string_view(q).substr(eq + 1));
    if (!bytes.ok()) return bytes.status();
    s.tenant_quota_bytes[q.substr(0, eq)] = *bytes;
  }
  return o;
}

}  // namespace

void RegisterCacheCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("cache", "Run the cache server (tiers, index, data plane)");
  auto flags = std::make_shared<ConfigFlags>();
  auto ready_file = std::make_shared<std::string>();
  cmd->add_option("--config,-c", flags->file, "YAML config file")->check(CLI::ExistingFile);
  cmd->add_option("--set", flags->overrides, "Override one key: key=value (repeatable)");
  cmd->add_option("--ready-file", *ready_file,
                  "Write 'grpc=PORT http=PORT' here once serving (for scripts and tests)");
  cmd->callback([flags, ready_file] {
    const StrataConfig config = LoadDaemonConfig(*flags, "cache");
    auto options = ToServerOptions(config);
    if (!options.ok()) Fail(2, StrCat("config: ", options.status().message()));
    const sigset_t signals = BlockTerminationSignals();
    cache::CacheServer server(*std::move(options));
    if (absl::Status st = server.Start(); !st.ok()) {
      Fail(1, StrCat("cache server: ", st.message()));
    }
    ServeUntilSignal(server, signals, *ready_file,
                     StrCat("grpc=", server.grpc_port(), " http=", server.http_port()),
                     "cache server");
  });
}

}  // namespace strata::cli
