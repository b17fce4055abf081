// Subcommands of the `strata` binary. Each lives in its own file and registers itself on the
// root CLI11 app; main.cc only calls the Register functions.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::cli {

void RegisterConfigCommand(CLI::App& app);  // strata config print
void RegisterInfoCommand(CLI::App& app);    // strata info

}  // namespace strata::cli
