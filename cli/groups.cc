#include <iostream>

#include "cli/commands.h"
#include "common/strings.h"

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

std::vector<int32_t> ParseTokenIdsOrFail(std::string_view text, std::string_view context) {
  std::string normalized(text);
  for (char& c : normalized) {
    if (c == ',' || c == '[' || c == ']' || c == '\n' || c == '\t' || c == '\r') c = ' ';
  }
  std::vector<int32_t> ids;
  for (std::string_view piece : StrSplit(normalized, ' ', /*skip_empty=*/true)) {
    const auto id = ParseInt64(piece);
    if (!id || *id < 0 || *id > INT32_MAX) Fail(2, StrCat(context, ": bad token id '", piece, "'"));
    ids.push_back(static_cast<int32_t>(*id));
  }
  return ids;
}

void Fail(int code, const std::string& message) {
  std::cerr << "strata: " << message << "\n";
  throw CLI::RuntimeError(code);
}

}  // namespace strata::cli
