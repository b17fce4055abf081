// strata admin scheduler nodes|drain|policy|index
//
// The CLI over the SchedulerAdmin gRPC API (`strata scheduler`). Human tables by default, --json
// for scripts (the response message in proto3 JSON). Exit codes, as `strata admin cache`:
//   0 ok · 1 the call failed · 2 bad usage · 3 refused (no or wrong admin token)
//   4 not found · 5 scheduler unreachable
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <iostream>
#include <memory>

#include "absl/strings/str_format.h"
#include "cli/admin_client.h"
#include "cli/commands.h"
#include "cli/strata_config.h"
#include "common/file_util.h"
#include "common/strings.h"
#include "strata/v1/scheduler.grpc.pb.h"

namespace strata::cli {
namespace {

std::string SchedulerAddress(const StrataConfig& config) { return config.scheduler.listen; }

class SchedulerAdminClient : public AdminClient<v1::SchedulerAdmin> {
 public:
  explicit SchedulerAdminClient(const AdminFlags& flags)
      : AdminClient(flags, &SchedulerAddress, "scheduler admin", std::chrono::seconds(30)) {}
};

std::string RoleLabel(v1::NodeRole role) {
  switch (role) {
    case v1::ROLE_PREFILL:
      return "prefill";
    case v1::ROLE_DECODE:
      return "decode";
    case v1::ROLE_BOTH:
      return "both";
    default:
      return "-";
  }
}

void PrintNodes(const v1::ListNodesResponse& r) {
  std::cout << "policy: " << r.policy() << "\n";
  std::cout << absl::StrFormat("%-16s %-8s %-6s %-22s %-22s %7s %7s %9s %9s\n", "NODE", "ROLE",
                               "STATE", "ADDRESS", "CACHE", "QUEUED", "RUNNING", "FREE_PG",
                               "BLOCKS");
  for (const v1::NodeState& n : r.nodes()) {
    const std::string state = !n.alive() ? "dead" : n.draining() ? "drain" : "up";
    std::cout << absl::StrFormat(
        "%-16s %-8s %-6s %-22s %-22s %7u %7u %9u %9u\n", n.node().node_id(),
        RoleLabel(n.node().role()), state, n.node().grpc_address(),
        n.node().cache_address().empty() ? "-" : n.node().cache_address(),
        n.load().queued_requests(), n.load().running_requests(), n.load().free_kv_pages(),
        static_cast<unsigned>(n.indexed_blocks()));
  }
}

}  // namespace

void RegisterAdminSchedulerCommand(CLI::App& app) {
  CLI::App* sched =
      AdminGroup(app).add_subcommand("scheduler", "Inspect and steer the global scheduler");
  sched->require_subcommand(1);
  auto flags = std::make_shared<AdminFlags>();
  sched->add_option("--address,-a", flags->address,
                    "Scheduler gRPC address (default: scheduler.listen)");
  sched->add_option("--token-file", flags->token_file,
                    "Admin token file (default: cluster.admin_token_file, or $STRATA_ADMIN_TOKEN)");
  sched->add_option("--config,-c", flags->config.file, "YAML config file");
  sched->add_option("--set", flags->config.overrides, "Override one config key: key=value");
  sched->add_flag("--json", flags->json, "Print the response as JSON");

  sched->add_subcommand("nodes", "Workers: role, state, load, blocks indexed")->callback([flags] {
    SchedulerAdminClient client(*flags);
    auto r = client.Call<v1::ListNodesRequest, v1::ListNodesResponse>(
        &v1::SchedulerAdmin::Stub::ListNodes, {});
    flags->json ? PrintJson(r) : PrintNodes(r);
  });

  auto drain_node = std::make_shared<std::string>();
  auto undrain = std::make_shared<bool>(false);
  CLI::App* drain = sched->add_subcommand("drain", "Stop placing work on a node (or --undrain)");
  drain->add_option("--node", *drain_node, "Node id")->required();
  drain->add_flag("--undrain", *undrain, "Place work on it again");
  drain->callback([flags, drain_node, undrain] {
    SchedulerAdminClient client(*flags);
    v1::DrainNodeRequest req;
    req.set_node_id(*drain_node);
    req.set_undrain(*undrain);
    auto r = client.Call<v1::DrainNodeRequest, v1::DrainNodeResponse>(
        &v1::SchedulerAdmin::Stub::DrainNode, req);
    if (flags->json) {
      PrintJson(r);
    } else {
      std::cout << r.node().node().node_id()
                << (r.node().draining() ? " draining\n" : " serving\n");
    }
  });

  auto policy = std::make_shared<std::string>();
  CLI::App* pol = sched->add_subcommand("policy", "Switch the placement policy");
  pol->add_option("--set", *policy,
                  "random | round_robin | least_loaded | cache_aware_local | strata")
      ->required();
  pol->callback([flags, policy] {
    SchedulerAdminClient client(*flags);
    v1::SetPolicyRequest req;
    req.set_policy(*policy);
    auto r = client.Call<v1::SetPolicyRequest, v1::SetPolicyResponse>(
        &v1::SchedulerAdmin::Stub::SetPolicy, req);
    flags->json ? PrintJson(r) : void(std::cout << r.previous() << " -> " << *policy << "\n");
  });

  sched->add_subcommand("index", "Prefix index statistics")->callback([flags] {
    SchedulerAdminClient client(*flags);
    auto r = client.Call<v1::GetIndexStatsRequest, v1::GetIndexStatsResponse>(
        &v1::SchedulerAdmin::Stub::GetIndexStats, {});
    if (flags->json) {
      PrintJson(r);
      return;
    }
    std::cout << absl::StrFormat(
        "indexed blocks  %u / %u\nholders         %u\nmemory          %u bytes\n"
        "forgotten       %u (index full)\nevents applied  %u\ndigests applied %u\n",
        r.indexed_blocks(), r.capacity_blocks(), r.holders(), r.memory_bytes(), r.evicted_entries(),
        r.events_applied(), r.digests_applied());
  });
}

}  // namespace strata::cli
