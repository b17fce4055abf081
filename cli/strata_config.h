// The configuration of a Strata process: one YAML file (a whole cluster's, or one daemon's),
// STRATA_* environment variables and --set flags, through common/config.h.
//
// Each subsystem owns one section struct and registers it here; `strata config print` shows the
// effective values and where each came from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/logging.h"
#include "transfer/transfer_engine.h"

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

// `cache.*`: the cache server (`strata cache`, cache_service/). Sizes are bytes.
struct CacheSection {
  std::string listen = "127.0.0.1:7400";           // gRPC (CacheControl, CacheAdmin)
  std::string http_listen = "127.0.0.1:7401";      // /metrics, /healthz; empty: off
  std::string transfer_listen = "127.0.0.1:7402";  // data plane (tcp); empty: off
  std::string shm_socket;  // unix socket for same-host shm mapping; empty: off
  std::string server_id = "cache-0";
  std::string host_id;  // empty: the host name
  std::string data_dir = "/var/lib/strata/cache";
  uint64_t slot_bytes = 4608ull << 10;  // 4.5 MiB: a 64-token bf16 block of a 61-layer model
  uint64_t dram_capacity = 8ull << 30;
  uint64_t dram_max = 0;      // 0: dram capacity (the most set-capacity may grow it to)
  bool dram_prefault = true;  // back the capacity's pages at start (no faults on the data path)
  double dram_high_watermark = 0.95;
  double dram_low_watermark = 0.85;
  std::string ssd_dir;        // empty: <data_dir>/ssd
  uint64_t ssd_capacity = 0;  // 0: no SSD tier
  uint64_t ssd_max = 0;
  int64_t ssd_slots_per_file = 256;
  double ssd_high_watermark = 0.95;
  double ssd_low_watermark = 0.85;
  std::string write_policy = "write_through";
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration digest_interval = absl::Seconds(30);
  int64_t event_log = 65536;  // KV events kept for subscribers that resume
  std::vector<std::string> tenant_quotas;  // "tenant=bytes", e.g. "acme=100GiB"

  void Register(ConfigSchema& schema);
};

// `worker.*`: a compute node (`strata worker`, compute_nodes/worker/).
struct WorkerSection {
  std::string role = "both";  // prefill | decode | both
  std::string model;          // Hugging Face model directory
  std::string backend = "cpu";
  std::string node_id = "worker-0";
  std::string listen = "127.0.0.1:7500";         // gRPC (Worker)
  std::string http_listen = "127.0.0.1:7501";    // /metrics, /healthz; empty: off
  std::string host_id;                           // empty: the host name
  std::string cache_address = "127.0.0.1:7400";  // this host's cache server; empty: none
  std::string scheduler_address;                 // empty: standalone
  int64_t kv_pages = 256;
  int64_t block_tokens = 64;
  std::string kv_precision = "bf16";  // bf16 | fp32
  std::string cache_codec = "bf16";   // bf16 | fp8
  bool cache_read_in_place = true;    // cuda: cached blocks read from the shm arena in place
  bool resident_blocks = true;        // ended sequences' full blocks stay in the KV pool
  int64_t token_budget = 512;
  int64_t max_running = 64;
  int64_t max_queued = 1024;
  // Tests only: fault injection on the cache data plane.
  double fault_corrupt = 0;
  double fault_delay = 0;
  absl::Duration fault_delay_by = absl::Milliseconds(50);

  void Register(ConfigSchema& schema);
};

// `scheduler.*`: the global scheduler and OpenAI gateway (`strata scheduler`, scheduler/).
struct SchedulerSection {
  std::string listen = "127.0.0.1:7300";       // gRPC (Scheduler: workers register here)
  std::string http_listen = "127.0.0.1:8000";  // OpenAI-compatible HTTP; empty: off
  std::string policy = "strata";
  std::string model;  // model directory (tokenizer, chat template); its name is the model id
  absl::Duration heartbeat_interval = absl::Seconds(1);
  int64_t missed_heartbeats = 3;
  int64_t http_threads = 2;
  std::string api_keys_file;  // one bearer key per line; empty: no authentication
  absl::Duration request_timeout = absl::Minutes(10);

  void Register(ConfigSchema& schema);
};

// `up.*`: the local cluster `strata up` starts and supervises (cli/up/). Every daemon of it
// reads the same file; `up` adds each one's ports, directories and node id.
struct UpSection {
  std::string run_dir = "strata-run";  // logs, data, model, effective config; relative to cwd
  std::string model = "small-v3";      // a model directory, or a preset made on first run
  int64_t model_seed = 1;
  int64_t prefill_workers = 1;
  int64_t decode_workers = 1;
  int64_t workers = 0;       // role `both`
  int64_t http_port = 8000;  // the OpenAI gateway; 0: any free port
  absl::Duration start_timeout = absl::Seconds(120);
  absl::Duration stop_timeout = absl::Seconds(20);
  absl::Duration max_backoff = absl::Seconds(30);

  void Register(ConfigSchema& schema);
};

// `transfer.*`: the transfer engine of every process that moves KV blocks (workers' cache
// clients, the cache server's TransferServer, benchmarks). ToEngineOptions() fills
// transfer::EngineOptions (host_id and secret come from the caller's own section).
struct TransferSection {
  std::string transport = "auto";  // auto | shm | tcp | rdma | cuda
  int64_t tcp_connections_per_peer = 4;
  int64_t tcp_threads_per_peer = 4;
  bool rdma_enable = true;
  int64_t rdma_qps_per_peer = 4;
  bool cuda_enable = true;
  absl::Duration connect_timeout = absl::Seconds(5);
  absl::Duration request_timeout = absl::Seconds(10);

  void Register(ConfigSchema& schema);
  // InvalidArgument for an unknown transport name (the schema's enum already refuses one).
  absl::StatusOr<transfer::EngineOptions> ToEngineOptions(std::string host_id,
                                                          transfer::ClusterSecret secret) const;
};

struct StrataConfig {
  LogSection log;
  ClusterSection cluster;
  TransferSection transfer;
  CacheSection cache;
  WorkerSection worker;
  SchedulerSection scheduler;
  UpSection up;

  // Registers every section's options with `schema`, bound to this object's fields.
  void Register(ConfigSchema& schema);
};

// Where a config comes from on the command line: --config FILE and repeated --set key=value.
struct ConfigFlags {
  std::string file;
  std::vector<std::string> overrides;
};

}  // namespace strata
