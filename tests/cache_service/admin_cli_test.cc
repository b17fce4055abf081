// `strata admin cache ...` against a running daemon: tables, --json, and exit codes that mean
// something (0 ok, 2 usage, 3 refused, 5 unreachable, 6 corrupt blocks found).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>

#include "tests/cache_service/daemon_util.h"
#include "tests/cache_service/store_test_util.h"
#include "tests/util/subprocess.h"

namespace strata::cache {
namespace {

using testing_util::Daemon;
using testing_util::FreshDir;
using testing_util::StrataBinary;

struct CliRun {
  int code = -1;
  std::string out;
};

CliRun Strata(const std::string& args) {
  const auto r = ::strata::testing_util::RunCommand(StrataBinary() + " " + args);
  return {r.exit_code, r.output};
}

TEST(AdminCliTest, CommandsTablesJsonAndExitCodes) {
  const std::string dir = FreshDir("admin-cli");
  const std::string token = dir + "/token";
  std::ofstream(token) << "cli-token\n";
  std::ofstream(dir + "/wrong") << "nope\n";
  Daemon daemon(dir + "/data", token, {"cache.ssd.capacity=8MiB"});
  daemon.Start();
  if (HasFatalFailure()) return;
  const std::string base = "admin cache -a " + daemon.address() + " --token-file " + token + " ";

  CliRun r = Strata(base + "stats");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("TIER"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dram"), std::string::npos) << r.out;

  r = Strata(base + "--json tiers");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\"TIER_SSD\""), std::string::npos) << r.out;

  r = Strata("admin cache -a " + daemon.address() + " --token-file " + dir + "/wrong stats");
  EXPECT_EQ(r.code, 3) << r.out;

  r = Strata(base + "set-capacity --tier dram --capacity 1MiB");
  EXPECT_EQ(r.code, 0) << r.out;
  r = Strata(base + "set-capacity --tier tape --capacity 1MiB");
  EXPECT_EQ(r.code, 2) << r.out;
  r = Strata(base + "set-capacity --tier dram --capacity 1TiB");
  EXPECT_EQ(r.code, 2) << r.out;  // beyond the arena: invalid argument

  EXPECT_EQ(Strata(base + "list").code, 0);
  EXPECT_EQ(Strata(base + "verify").code, 0);
  EXPECT_EQ(Strata(base + "flush").code, 0);
  EXPECT_EQ(Strata(base + "drain").code, 0);
  {
    // drain --to another cache server (a live one with a data plane), and never into itself.
    Daemon other(dir + "/data-other", token,
                 {"cache.server_id=cache-other", "cache.transfer_listen=127.0.0.1:0"});
    other.Start();
    if (HasFatalFailure()) return;
    r = Strata(base + "--json drain --to " + other.address());
    EXPECT_EQ(r.code, 0) << r.out;
    r = Strata(base + "drain --to " + daemon.address());
    EXPECT_EQ(r.code, 2) << r.out;  // the target is this server: invalid argument
    r = Strata(base + "drain --to 127.0.0.1:1");
    EXPECT_NE(r.code, 0) << r.out;  // nobody there: nothing moved, an error
  }
  EXPECT_EQ(Strata(base + "pin --all").code, 0);
  EXPECT_EQ(Strata(base + "unpin --all").code, 0);
  r = Strata(base + "--json evict --all");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("evictedBlocks"), std::string::npos) << r.out;
  EXPECT_EQ(Strata(base + "evict").code, 2);  // no selector
  daemon.Kill();
  r = Strata(base + "stats");
  EXPECT_EQ(r.code, 5) << r.out;  // unreachable
}

}  // namespace
}  // namespace strata::cache
