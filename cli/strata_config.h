// The configuration of a Strata process: one YAML file (a whole cluster's, or one daemon's),
// STRATA_* environment variables and --set flags, through common/config.h.
//
// Each subsystem owns one section struct and registers it here; `strata config print` shows the
// effective values and where each came from.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config.h"
#include "common/logging.h"

namespace strata {

struct LogSection {
  std::string level = "info";
  std::string format = "text";
  std::string file;  // empty: stderr

  void Register(ConfigSchema& schema);
  LogOptions ToOptions(std::string component) const;
};

struct ClusterSection {
  std::string name = "strata";
  // File holding the shared secret peers authenticate with; empty: no authentication
  // (loopback development clusters only).
  std::string secret_file;
  // File holding the bearer token admin calls must carry; empty: admin calls refused.
  std::string admin_token_file;

  void Register(ConfigSchema& schema);
};

struct StrataConfig {
  LogSection log;
  ClusterSection cluster;

  // Registers every section's options with `schema`, bound to this object's fields.
  void Register(ConfigSchema& schema);
};

// Where a config comes from on the command line: --config FILE and repeated --set key=value.
struct ConfigFlags {
  std::string file;
  std::vector<std::string> overrides;
};

}  // namespace strata
