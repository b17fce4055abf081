#include "cli/strata_config.h"

namespace strata {

void LogSection::Register(ConfigSchema& schema) {
  schema.AddEnum("log.level", &level,
                 {"trace", "debug", "info", "warn", "error", "critical", "off"},
                 "Minimum level logged");
  schema.AddEnum("log.format", &format, {"text", "json"},
                 "text for people, json for log pipelines (one object per line)");
  schema.AddString("log.file", &file, "Log file; empty logs to stderr");
}

LogOptions LogSection::ToOptions(std::string component) const {
  LogOptions options;
  options.level = level;
  options.format = format == "json" ? LogFormat::kJson : LogFormat::kText;
  options.file = file;
  options.component = std::move(component);
  return options;
}

void ClusterSection::Register(ConfigSchema& schema) {
  schema.AddString("cluster.name", &name, "Name of this cluster (labels, logs)");
  schema.AddString("cluster.secret_file", &secret_file,
                   "File with the secret peers authenticate with; empty disables peer auth");
  schema.AddString("cluster.admin_token_file", &admin_token_file,
                   "File with the bearer token for admin calls; empty refuses admin calls");
}

void StrataConfig::Register(ConfigSchema& schema) {
  log.Register(schema);
  cluster.Register(schema);
}

}  // namespace strata
