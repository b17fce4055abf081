// The plan of a one-machine Strata cluster (`strata up`): which daemons to start, with which
// arguments, ports and directories, from one `StrataConfig` whose `up.*` section describes the
// topology.
//
// Every daemon reads the same effective config file, `<run_dir>/cluster.yaml`, written by
// PlanLocalCluster with the loopback ports it picked and the paths it resolved; per-daemon values
// (node id, role, own ports) come as --set flags. Ports are chosen once, so a restarted daemon
// comes back on the address its peers know. Admin commands work against the same file:
// `strata admin cache --config <run_dir>/cluster.yaml stats`.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/strata_config.h"
#include "cli/up/process_supervisor.h"
#include "common/config.h"

namespace strata::cli {

struct LocalCluster {
  std::string run_dir;      // absolute
  std::string config_file;  // <run_dir>/cluster.yaml
  std::string model_dir;
  std::string model_id;     // what the OpenAI API calls the model
  bool model_made = false;  // made by this call (first run)
  std::string gateway_url;  // http://127.0.0.1:PORT
  std::string scheduler_address;
  std::string cache_address;
  std::vector<ProcessSpec> daemons;       // in start order: cache, scheduler, workers
  std::vector<std::string> worker_names;  // also their node ids
  // Where each daemon with an HTTP listener serves /metrics: {name, host:port}.
  std::vector<std::pair<std::string, std::string>> metrics;
};

// The model directory `up.model` names: a directory holding config.json is used as it is; a
// preset name (tiny, small-v3, ...) is made under <run_dir>/models/<preset> on first use
// (`made` says so).
absl::StatusOr<std::string> EnsureLocalModel(const UpSection& up, const std::string& run_dir,
                                             bool* made);

// Resolves the run directory, makes the model if needed, picks free loopback ports, writes the
// admin token (unless cluster.admin_token_file names one) and the effective config, and returns
// the daemons to start. `config` is updated in place (it is what `schema` renders); `exe` is the
// strata binary the daemons run.
absl::StatusOr<LocalCluster> PlanLocalCluster(StrataConfig& config, const ConfigSchema& schema,
                                              const std::string& exe);

}  // namespace strata::cli
