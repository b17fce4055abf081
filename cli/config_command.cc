// strata config print [--config FILE] [--set key=value]... [--no-comments]
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/strata_config.h"
#include "common/strings.h"

namespace strata::cli {

void RegisterConfigCommand(CLI::App& app) {
  CLI::App* config = app.add_subcommand("config", "Inspect Strata configuration");
  config->require_subcommand(1);
  CLI::App* print = config->add_subcommand(
      "print", "Print the effective configuration (file < STRATA_* env < --set), as YAML");
  auto flags = std::make_shared<ConfigFlags>();
  auto plain = std::make_shared<bool>(false);
  print->add_option("--config,-c", flags->file, "YAML config file")->check(CLI::ExistingFile);
  print->add_option("--set", flags->overrides, "Override one key: key=value (repeatable)");
  print->add_flag("--no-comments", *plain, "Print bare YAML without help and sources");
  print->callback([flags, plain] {
    StrataConfig config;
    ConfigSchema schema;
    config.Register(schema);
    if (absl::Status st = schema.Load({.file = flags->file, .overrides = flags->overrides});
        !st.ok()) {
      Fail(2, StrCat("config: ", st.message()));
    }
    std::cout << schema.Render(!*plain);
  });
}

}  // namespace strata::cli
