#include <iostream>

#include "cli/commands.h"

namespace strata::cli {
namespace {

CLI::App* FindSubcommand(CLI::App& app, const std::string& name) {
  for (CLI::App* sub : app.get_subcommands({})) {
    if (sub->get_name() == name) return sub;
  }
  return nullptr;
}

}  // namespace

CLI::App& BenchGroup(CLI::App& app) {
  if (CLI::App* existing = FindSubcommand(app, "bench")) return *existing;
  CLI::App* bench = app.add_subcommand(
      "bench", "Benchmarks; each reports ratios against a baseline measured in the same run");
  bench->require_subcommand(1);
  return *bench;
}

CLI::App& AdminGroup(CLI::App& app) {
  if (CLI::App* existing = FindSubcommand(app, "admin")) return *existing;
  CLI::App* admin = app.add_subcommand("admin", "Operator commands over the admin gRPC APIs");
  admin->require_subcommand(1);
  return *admin;
}

void Fail(int code, const std::string& message) {
  std::cerr << "strata: " << message << "\n";
  throw CLI::RuntimeError(code);
}

}  // namespace strata::cli
