// ProcessSupervisor and PlanLocalCluster (the parts of `strata up`), with real child processes.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "cli/strata_config.h"
#include "cli/up/local_cluster.h"
#include "cli/up/process_supervisor.h"
#include "common/file_util.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

std::string TestDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/up_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A daemon stand-in: writes its ready file, then sleeps until killed.
ProcessSpec Sleeper(const std::string& dir, const std::string& name) {
  const std::string ready = dir + "/" + name + ".ready";
  return {.name = name,
          .argv = {"/bin/sh", "-c", "echo serving; echo ok > " + ready + "; exec sleep 60"},
          .log_file = dir + "/" + name + ".log",
          .ready_file = ready};
}

bool WaitFor(const std::function<bool()>& done, ProcessSupervisor* supervisor = nullptr) {
  for (int i = 0; i < 300; ++i) {
    if (supervisor != nullptr) supervisor->Poll();
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(ProcessSupervisorTest, RestartsACrashedChildAndStopsEverythingInOrder) {
  const std::string dir = TestDir("restart");
  std::vector<std::string> events;
  ProcessSupervisor supervisor({.min_backoff = absl::Milliseconds(50),
                                .on_event = [&](const std::string& e) { events.push_back(e); }});
  ASSERT_TRUE(supervisor.Start(Sleeper(dir, "a")).ok());
  ASSERT_TRUE(supervisor.Start(Sleeper(dir, "b")).ok());
  ASSERT_TRUE(supervisor.WaitReady("a", absl::Seconds(10)).ok());
  ASSERT_TRUE(supervisor.WaitReady("b", absl::Seconds(10)).ok());
  EXPECT_FALSE(supervisor.Start(Sleeper(dir, "a")).ok());  // names are unique

  const pid_t first = supervisor.Pid("b");
  ASSERT_GT(first, 0);
  ::kill(first, SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return supervisor.Pid("b") > 0 && supervisor.Pid("b") != first; },
                      &supervisor));
  EXPECT_EQ(supervisor.Restarts("b"), 1);
  EXPECT_EQ(supervisor.Restarts("a"), 0);
  ASSERT_TRUE(supervisor.WaitReady("b", absl::Seconds(10)).ok());  // ready again
  // The log keeps both runs, each after a banner.
  const std::string log = *ReadFile(dir + "/b.log");
  EXPECT_NE(log.find("starting b"), std::string::npos) << log;
  EXPECT_NE(log.find("restarting b"), std::string::npos) << log;
  EXPECT_NE(log.find("serving"), log.rfind("serving")) << log;  // both runs wrote to it
  bool said_killed = false;
  for (const std::string& e : events) said_killed |= e.find("b was killed by signal 9") == 0;
  EXPECT_TRUE(said_killed);

  const pid_t a = supervisor.Pid("a");
  events.clear();
  supervisor.StopAll(absl::Seconds(5));
  EXPECT_EQ(supervisor.Pid("a"), -1);
  EXPECT_EQ(supervisor.Pid("b"), -1);
  EXPECT_NE(::kill(a, 0), 0);  // gone and reaped
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], "stopped b");  // newest first
  EXPECT_EQ(events[1], "stopped a");
  supervisor.Poll();  // no restarts once stopping
  EXPECT_EQ(supervisor.Pid("a"), -1);
}

TEST(ProcessSupervisorTest, AChildThatDiesBeforeReadyIsAnErrorQuotingItsLog) {
  const std::string dir = TestDir("early");
  ProcessSupervisor supervisor({});
  ASSERT_TRUE(supervisor
                  .Start({.name = "bad",
                          .argv = {"/bin/sh", "-c", "echo 'config: no such key' >&2; exit 2"},
                          .log_file = dir + "/bad.log",
                          .ready_file = dir + "/bad.ready"})
                  .ok());
  const absl::Status st = supervisor.WaitReady("bad", absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_NE(st.message().find("config: no such key"), std::string::npos) << st;
}

TEST(ProcessSupervisorTest, ABinaryThatCannotRunIsReported) {
  const std::string dir = TestDir("noexec");
  ProcessSupervisor supervisor({});
  ASSERT_TRUE(supervisor
                  .Start({.name = "ghost",
                          .argv = {dir + "/does-not-exist"},
                          .log_file = dir + "/ghost.log",
                          .ready_file = dir + "/ghost.ready"})
                  .ok());
  const absl::Status st = supervisor.WaitReady("ghost", absl::Seconds(10));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("exec failed"), std::string::npos) << st;
}

TEST(ProcessSupervisorTest, ANeverReadyChildTimesOut) {
  const std::string dir = TestDir("slow");
  ProcessSupervisor supervisor({});
  ProcessSpec spec = Sleeper(dir, "slow");
  spec.argv = {"/bin/sh", "-c", "exec sleep 60"};
  ASSERT_TRUE(supervisor.Start(spec).ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(supervisor.WaitReady("slow", absl::Milliseconds(300))));
}

class LocalClusterTest : public ::testing::Test {
 protected:
  void Load(const std::vector<std::string>& overrides) {
    config_.Register(schema_);
    ConfigSources sources;
    sources.overrides = overrides;
    ASSERT_TRUE(schema_.Load(sources).ok());
  }
  StrataConfig config_;
  ConfigSchema schema_;
};

TEST_F(LocalClusterTest, PlansEveryDaemonOnDistinctPortsWithOneConfigFile) {
  const std::string dir = TestDir("plan");
  Load({"up.run_dir=" + dir + "/run", "up.model=tiny", "up.prefill_workers=1",
        "up.decode_workers=2", "up.http_port=0"});
  auto plan = PlanLocalCluster(config_, schema_, "/usr/bin/strata");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->model_made);
  EXPECT_TRUE(fs::exists(dir + "/run/models/tiny/config.json"));
  EXPECT_EQ(plan->model_id, "tiny");
  ASSERT_EQ(plan->daemons.size(), 5u);
  EXPECT_EQ(plan->daemons[0].name, "cache");
  EXPECT_EQ(plan->daemons[1].name, "scheduler");
  EXPECT_EQ(plan->worker_names, (std::vector<std::string>{"prefill-0", "decode-0", "decode-1"}));
  // Every listen address differs.
  std::set<std::string> addresses = {config_.cache.listen, config_.cache.http_listen,
                                     config_.cache.transfer_listen, config_.scheduler.listen,
                                     config_.scheduler.http_listen};
  for (const ProcessSpec& d : plan->daemons) {
    EXPECT_EQ(d.argv[0], "/usr/bin/strata");
    EXPECT_EQ(d.argv[3], plan->config_file);
    for (const std::string& arg : d.argv) {
      if (arg.starts_with("worker.listen=") || arg.starts_with("worker.http_listen=")) {
        addresses.insert(arg.substr(arg.find('=') + 1));
      }
    }
  }
  EXPECT_EQ(addresses.size(), 5u + 2 * 3);
  // /metrics of the cache, the scheduler and each worker, on addresses of the plan.
  ASSERT_EQ(plan->metrics.size(), 2u + 3);
  EXPECT_EQ(plan->metrics[0],
            (std::pair<std::string, std::string>{"cache", config_.cache.http_listen}));
  EXPECT_EQ(plan->metrics[4].first, "decode-1");
  EXPECT_TRUE(addresses.contains(plan->metrics[4].second));
  // The file every daemon reads loads back to the same addresses and paths.
  StrataConfig back;
  ConfigSchema schema;
  back.Register(schema);
  ConfigSources sources;
  sources.file = plan->config_file;
  ASSERT_TRUE(schema.Load(sources).ok());
  EXPECT_EQ(back.worker.cache_address, config_.cache.listen);
  EXPECT_EQ(back.worker.scheduler_address, config_.scheduler.listen);
  EXPECT_EQ(back.scheduler.model, plan->model_dir);
  EXPECT_EQ(back.cache.data_dir, plan->run_dir + "/cache");
  EXPECT_TRUE(ReadSecretFile(back.cluster.admin_token_file, "admin token").ok());
  EXPECT_EQ(plan->gateway_url, "http://" + config_.scheduler.http_listen);

  // A second plan reuses the model and the token.
  const std::string token = *ReadFile(back.cluster.admin_token_file);
  StrataConfig again;
  ConfigSchema again_schema;
  again.Register(again_schema);
  ConfigSources again_sources;
  again_sources.overrides = {"up.run_dir=" + dir + "/run", "up.model=tiny"};
  ASSERT_TRUE(again_schema.Load(again_sources).ok());
  auto second = PlanLocalCluster(again, again_schema, "/usr/bin/strata");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->model_made);
  EXPECT_EQ(*ReadFile(again.cluster.admin_token_file), token);
}

TEST_F(LocalClusterTest, RefusesAnUnknownModelAndAHalfDisaggregatedCluster) {
  const std::string dir = TestDir("bad");
  Load({"up.run_dir=" + dir, "up.model=no-such-preset"});
  auto plan = PlanLocalCluster(config_, schema_, "/bin/true");
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
  EXPECT_NE(plan.status().message().find("small-v3"), std::string::npos);  // lists the presets

  StrataConfig c;
  ConfigSchema s;
  c.Register(s);
  ConfigSources sources;
  sources.overrides = {"up.run_dir=" + dir, "up.model=tiny", "up.decode_workers=0"};
  ASSERT_TRUE(s.Load(sources).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(PlanLocalCluster(c, s, "/bin/true").status()));
}

}  // namespace
}  // namespace strata::cli
