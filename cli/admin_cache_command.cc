// strata admin cache stats|tiers|set-capacity|list|evict|pin|unpin|flush|verify|drain
//
// The CLI over the CacheAdmin gRPC API. Human tables by default, --json for scripts (the
// response message in proto3 JSON: bytes fields are base64). Exit codes:
//   0 ok · 1 the call failed · 2 bad usage · 3 refused (no or wrong admin token)
//   4 not found / not configured · 5 server unreachable · 6 verify found corrupt blocks
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <iostream>
#include <memory>

#include "absl/strings/str_format.h"
#include "cli/admin_client.h"
#include "cli/commands.h"
#include "cli/strata_config.h"
#include "common/block_key.h"
#include "common/file_util.h"
#include "common/grpc_status.h"
#include "common/hex.h"
#include "common/strings.h"
#include "strata/v1/cache_admin.grpc.pb.h"

namespace strata::cli {
namespace {

std::string CacheAddress(const StrataConfig& config) { return config.cache.listen; }

// Cache admin calls can scan or move many blocks: a generous deadline.
class CacheAdminClient : public AdminClient<v1::CacheAdmin> {
 public:
  explicit CacheAdminClient(const AdminFlags& flags)
      : AdminClient(flags, &CacheAddress, "cache admin", std::chrono::seconds(60)) {}
};

std::string TierLabel(int tier) {
  switch (tier) {
    case v1::TIER_GPU:
      return "gpu";
    case v1::TIER_DRAM:
      return "dram";
    case v1::TIER_SSD:
      return "ssd";
    default:
      return "-";
  }
}

v1::Tier ParseTier(const std::string& name) {
  if (name.empty() || name == "all") return v1::TIER_UNSPECIFIED;
  if (name == "dram") return v1::TIER_DRAM;
  if (name == "ssd") return v1::TIER_SSD;
  if (name == "gpu") return v1::TIER_GPU;
  Fail(2, StrCat("unknown tier '", name, "' (dram | ssd | gpu)"));
}

void PrintTiers(const v1::GetStatsResponse& s) {
  std::cout << absl::StrFormat("%-5s %12s %12s %6s %10s %10s %7s %10s %10s %9s %10s\n", "TIER",
                               "CAPACITY", "USED", "USE%", "BLOCKS", "HITS", "HIT%", "IN", "OUT",
                               "EVICTED", "PROMOTED");
  for (const auto& t : s.tiers()) {
    const double use = t.capacity_bytes() ? 100.0 * t.used_bytes() / t.capacity_bytes() : 0;
    const double total = double(t.hits()) + t.misses();
    std::cout << absl::StrFormat(
        "%-5s %12s %12s %5.1f%% %10d %10d %6.1f%% %10s %10s %9d %10d\n", TierLabel(t.tier()),
        FormatBytes(t.capacity_bytes()), FormatBytes(t.used_bytes()), use, t.blocks(), t.hits(),
        total > 0 ? 100.0 * t.hits() / total : 0.0, FormatBytes(t.bytes_in()),
        FormatBytes(t.bytes_out()), t.evictions(), t.promotions());
  }
}

struct SelectorFlags {
  std::vector<std::string> keys;
  std::string tenant;
  bool all = false;
  std::string ns;
  std::vector<uint32_t> tokens;
};

void AddSelectorOptions(CLI::App* cmd, SelectorFlags& s) {
  cmd->add_option("--key", s.keys, "Block key in hex (repeatable)");
  cmd->add_option("--tenant", s.tenant, "Every block of this tenant");
  cmd->add_flag("--all", s.all, "Every block");
  cmd->add_option("--namespace", s.ns, "Namespace in hex, with --tokens");
  cmd->add_option("--tokens", s.tokens, "Token ids of a prefix (with --namespace)")->delimiter(',');
}

v1::BlockSelector ToSelector(const SelectorFlags& s) {
  v1::BlockSelector sel;
  const int chosen = !s.keys.empty() + !s.tenant.empty() + s.all + !s.ns.empty();
  if (chosen != 1) Fail(2, "give exactly one of --key, --tenant, --all, --namespace/--tokens");
  if (!s.keys.empty()) {
    for (const auto& hex : s.keys) {
      auto key = ParseBlockKey(hex);
      if (!key.ok()) Fail(2, StrCat("--key ", hex, ": ", key.status().message()));
      sel.mutable_keys()->add_keys(std::string(key->View()));
    }
  } else if (!s.tenant.empty()) {
    sel.set_tenant(s.tenant);
  } else if (s.all) {
    sel.set_all(true);
  } else {
    auto ns = ParseNamespace(s.ns);
    if (!ns.ok()) Fail(2, StrCat("--namespace: ", ns.status().message()));
    if (s.tokens.empty()) Fail(2, "--namespace needs --tokens");
    sel.mutable_token_prefix()->set_namespace_id(std::string(ns->View()));
    for (uint32_t t : s.tokens) sel.mutable_token_prefix()->add_tokens(t);
  }
  return sel;
}

std::string Hex(const std::string& bytes) {
  return HexEncode(std::string_view(bytes.data(), bytes.size()));
}

}  // namespace

void RegisterAdminCacheCommand(CLI::App& app) {
  CLI::App* cache = AdminGroup(app).add_subcommand("cache", "Inspect and operate a cache server");
  cache->require_subcommand(1);
  auto flags = std::make_shared<AdminFlags>();
  cache->add_option("--address,-a", flags->address,
                    "Cache server gRPC address (default: cache.listen)");
  cache->add_option("--token-file", flags->token_file,
                    "Admin token file (default: cluster.admin_token_file, or $STRATA_ADMIN_TOKEN)");
  cache->add_option("--config,-c", flags->config.file, "YAML config file");
  cache->add_option("--set", flags->config.overrides, "Override one config key: key=value");
  cache->add_flag("--json", flags->json, "Print the response as JSON");

  cache->add_subcommand("stats", "Server and tier statistics")->callback([flags] {
    CacheAdminClient c(*flags);
    auto s = c.Call<v1::GetStatsRequest, v1::GetStatsResponse>(&v1::CacheAdmin::Stub::GetStats, {});
    if (c.json()) return PrintJson(s);
    std::cout << "server " << s.server_id() << "  up " << s.uptime_ms() / 1000 << "s  blocks "
              << s.blocks() << "  quarantined " << s.quarantined() << "  leases "
              << s.active_leases() << " (expired " << s.lease_expiries() << ")\n";
    PrintTiers(s);
  });
  cache->add_subcommand("tiers", "Per-tier capacity, usage and hit ratio")->callback([flags] {
    CacheAdminClient c(*flags);
    auto s = c.Call<v1::GetStatsRequest, v1::GetStatsResponse>(&v1::CacheAdmin::Stub::GetStats, {});
    if (c.json()) {
      v1::GetStatsResponse only;
      *only.mutable_tiers() = s.tiers();
      return PrintJson(only);
    }
    PrintTiers(s);
  });

  auto cap_tier = std::make_shared<std::string>();
  auto cap_size = std::make_shared<std::string>();
  CLI::App* setcap = cache->add_subcommand("set-capacity", "Resize a tier (evicts to fit)");
  setcap->add_option("--tier", *cap_tier, "dram | ssd")->required();
  setcap->add_option("--capacity", *cap_size, "New capacity, e.g. 16GiB")->required();
  setcap->callback([flags, cap_tier, cap_size] {
    v1::SetTierCapacityRequest req;
    req.set_tier(ParseTier(*cap_tier));
    auto bytes = ParseBytes(*cap_size);
    if (!bytes.ok()) Fail(2, StrCat("--capacity: ", bytes.status().message()));
    req.set_capacity_bytes(*bytes);
    CacheAdminClient c(*flags);
    auto r = c.Call<v1::SetTierCapacityRequest, v1::SetTierCapacityResponse>(
        &v1::CacheAdmin::Stub::SetTierCapacity, req);
    if (c.json()) return PrintJson(r);
    std::cout << TierLabel(r.tier().tier()) << " capacity "
              << FormatBytes(r.tier().capacity_bytes()) << ", used "
              << FormatBytes(r.tier().used_bytes()) << ", evicted " << r.evicted_blocks()
              << " blocks\n";
  });

  auto list = std::make_shared<v1::ListBlocksRequest>();
  auto list_tier = std::make_shared<std::string>();
  auto list_ns = std::make_shared<std::string>();
  auto list_limit = std::make_shared<uint32_t>(0);
  CLI::App* ls = cache->add_subcommand("list", "List blocks (paged)");
  ls->add_option("--tenant", *list->mutable_tenant(), "Only this tenant");
  ls->add_option("--namespace", *list_ns, "Only this namespace (hex)");
  ls->add_option("--tier", *list_tier, "Only blocks resident in this tier");
  ls->add_option("--limit", *list_limit, "Stop after this many blocks (0: all)");
  ls->callback([flags, list, list_tier, list_ns, list_limit] {
    v1::ListBlocksRequest req = *list;
    req.set_tier(ParseTier(*list_tier));
    if (!list_ns->empty()) {
      auto ns = ParseNamespace(*list_ns);
      if (!ns.ok()) Fail(2, StrCat("--namespace: ", ns.status().message()));
      req.set_namespace_id(std::string(ns->View()));
    }
    CacheAdminClient c(*flags);
    v1::ListBlocksResponse all;
    do {
      auto page = c.Call<v1::ListBlocksRequest, v1::ListBlocksResponse>(
          &v1::CacheAdmin::Stub::ListBlocks, req);
      for (auto& b : *page.mutable_blocks()) {
        if (*list_limit && all.blocks_size() >= static_cast<int>(*list_limit)) break;
        *all.add_blocks() = std::move(b);
      }
      req.set_page_token(page.next_page_token());
    } while (!req.page_token().empty() &&
             !(*list_limit && all.blocks_size() >= static_cast<int>(*list_limit)));
    if (c.json()) return PrintJson(all);
    std::cout << absl::StrFormat("%-32s %-12s %-9s %10s %6s %-5s\n", "KEY", "TENANT", "TIERS",
                                 "BYTES", "HITS", "PIN");
    for (const auto& b : all.blocks()) {
      std::vector<std::string> tiers;
      for (int t : b.tiers()) tiers.push_back(TierLabel(t));
      std::cout << absl::StrFormat("%-32s %-12s %-9s %10d %6d %-5s\n", Hex(b.key()), b.tenant(),
                                   StrJoin(tiers, ","), b.payload_bytes(), b.hits(),
                                   b.pin() == v1::PIN_HARD  ? "hard"
                                   : b.pin() == v1::PIN_TTL ? "ttl"
                                                            : "-");
    }
    std::cout << all.blocks_size() << " blocks\n";
  });

  auto ev_sel = std::make_shared<SelectorFlags>();
  auto ev_tier = std::make_shared<std::string>();
  auto ev_pinned = std::make_shared<bool>(false);
  CLI::App* evict =
      cache->add_subcommand("evict", "Evict blocks (keys, a token prefix, a tenant, all)");
  AddSelectorOptions(evict, *ev_sel);
  evict->add_option("--tier", *ev_tier, "Only from this tier (default: every tier)");
  evict->add_flag("--include-pinned", *ev_pinned, "Evict pinned blocks too");
  evict->callback([flags, ev_sel, ev_tier, ev_pinned] {
    v1::EvictRequest req;
    *req.mutable_selector() = ToSelector(*ev_sel);
    req.set_tier(ParseTier(*ev_tier));
    req.set_include_pinned(*ev_pinned);
    CacheAdminClient c(*flags);
    auto r = c.Call<v1::EvictRequest, v1::EvictResponse>(&v1::CacheAdmin::Stub::Evict, req);
    if (c.json()) return PrintJson(r);
    std::cout << "evicted " << r.evicted_blocks() << " blocks (" << FormatBytes(r.freed_bytes())
              << "), skipped " << r.skipped_pinned() << " pinned or in use\n";
  });

  auto pin_sel = std::make_shared<SelectorFlags>();
  auto pin_ttl = std::make_shared<std::string>();
  CLI::App* pin = cache->add_subcommand("pin", "Pin blocks: hard (default) or for a TTL");
  AddSelectorOptions(pin, *pin_sel);
  pin->add_option("--ttl", *pin_ttl, "Pin for this long (e.g. 10m); default: hard pin");
  pin->callback([flags, pin_sel, pin_ttl] {
    v1::PinRequest req;
    *req.mutable_selector() = ToSelector(*pin_sel);
    if (pin_ttl->empty()) {
      req.set_kind(v1::PIN_HARD);
    } else {
      absl::Duration d;
      if (!absl::ParseDuration(*pin_ttl, &d) || d < absl::Seconds(1)) {
        Fail(2, StrCat("--ttl '", *pin_ttl, "' is not a duration of at least 1s"));
      }
      req.set_kind(v1::PIN_TTL);
      req.set_ttl_seconds(static_cast<uint32_t>(absl::ToInt64Seconds(d)));
    }
    CacheAdminClient c(*flags);
    auto r = c.Call<v1::PinRequest, v1::PinResponse>(&v1::CacheAdmin::Stub::Pin, req);
    if (c.json()) return PrintJson(r);
    std::cout << "pinned " << r.pinned_blocks() << " blocks, " << r.missing_blocks()
              << " not found\n";
  });

  auto unpin_sel = std::make_shared<SelectorFlags>();
  CLI::App* unpin = cache->add_subcommand("unpin", "Remove pins");
  AddSelectorOptions(unpin, *unpin_sel);
  unpin->callback([flags, unpin_sel] {
    v1::UnpinRequest req;
    *req.mutable_selector() = ToSelector(*unpin_sel);
    CacheAdminClient c(*flags);
    auto r = c.Call<v1::UnpinRequest, v1::UnpinResponse>(&v1::CacheAdmin::Stub::Unpin, req);
    if (c.json()) return PrintJson(r);
    std::cout << "unpinned " << r.unpinned_blocks() << " blocks\n";
  });

  cache->add_subcommand("flush", "Write every DRAM-only block to SSD")->callback([flags] {
    CacheAdminClient c(*flags);
    auto r = c.Call<v1::FlushRequest, v1::FlushResponse>(&v1::CacheAdmin::Stub::Flush, {});
    if (c.json()) return PrintJson(r);
    std::cout << "flushed " << r.flushed_blocks() << " blocks (" << FormatBytes(r.flushed_bytes())
              << ")\n";
  });

  auto ver_tier = std::make_shared<std::string>();
  auto ver_max = std::make_shared<uint32_t>(0);
  CLI::App* verify = cache->add_subcommand(
      "verify", "Re-read blocks and check checksums; corrupt ones are quarantined (exit 6)");
  verify->add_option("--tier", *ver_tier, "Only this tier");
  verify->add_option("--max", *ver_max, "Check at most this many blocks (0: all)");
  verify->callback([flags, ver_tier, ver_max] {
    v1::VerifyRequest req;
    req.set_tier(ParseTier(*ver_tier));
    req.set_max_blocks(*ver_max);
    CacheAdminClient c(*flags);
    auto r = c.Call<v1::VerifyRequest, v1::VerifyResponse>(&v1::CacheAdmin::Stub::Verify, req);
    if (c.json()) {
      PrintJson(r);
    } else {
      std::cout << "checked " << r.checked_blocks() << " blocks, " << r.corrupt_blocks()
                << " corrupt (quarantined)\n";
      for (const auto& k : r.quarantined_keys()) std::cout << "  " << Hex(k) << "\n";
    }
    if (r.corrupt_blocks() > 0) throw CLI::RuntimeError(6);
  });

  auto drain_target = std::make_shared<std::string>();
  CLI::App* drain = cache->add_subcommand(
      "drain",
      "Empty this host's DRAM tier into its SSD tier, or (--to) into another cache server");
  drain->add_option("--to,--target", *drain_target,
                    "Another cache server's gRPC HOST:PORT: blocks move there (checksum-verified, "
                    "with namespace, tenant and pins) and leave this server");
  drain->callback([flags, drain_target] {
    v1::DrainRequest req;
    req.set_target_address(*drain_target);
    CacheAdminClient c(*flags);
    auto r = c.Call<v1::DrainRequest, v1::DrainResponse>(&v1::CacheAdmin::Stub::Drain, req);
    if (c.json()) return PrintJson(r);
    std::cout << "moved " << r.moved_blocks() << " blocks (" << FormatBytes(r.moved_bytes())
              << "), " << r.failed_blocks() << " stayed\n";
  });
}

}  // namespace strata::cli
