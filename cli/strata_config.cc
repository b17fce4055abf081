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

void TransferSection::Register(ConfigSchema& schema) {
  schema.AddEnum("transfer.transport", &transport, {"auto", "shm", "tcp", "rdma", "cuda"},
                 "Transport for every peer; auto: shm on the same host, else rdma when both ends "
                 "have a device, else tcp");
  schema.AddInt("transfer.tcp.connections_per_peer", &tcp_connections_per_peer,
                "TCP connections the tcp transport opens to each peer", 1, 64);
  schema.AddInt("transfer.tcp.threads_per_peer", &tcp_threads_per_peer,
                "Receiving threads per peer, each owning a share of the connections", 1, 64);
  schema.AddBool("transfer.rdma.enable", &rdma_enable,
                 "Use RDMA (ibverbs) when this host has an active RDMA port");
  schema.AddInt("transfer.rdma.qps_per_peer", &rdma_qps_per_peer,
                "RC queue pairs the rdma transport opens to each peer", 1, 64);
  schema.AddBool("transfer.cuda.enable", &cuda_enable,
                 "Use the cuda transport for host<->GPU copies when a GPU is present");
  schema.AddDuration("transfer.connect_timeout", &connect_timeout,
                     "Longest wait to connect (and authenticate) to a peer");
  schema.AddDuration("transfer.request_timeout", &request_timeout,
                     "Deadline of each batch of block transfers");
}

absl::StatusOr<transfer::EngineOptions> TransferSection::ToEngineOptions(
    std::string host_id, transfer::ClusterSecret secret) const {
  transfer::EngineOptions o;
  o.host_id = std::move(host_id);
  o.secret = std::move(secret);
  if (transport != "auto") {
    auto kind = transfer::ParseTransportKind(transport);
    if (!kind.ok()) return kind.status();
    o.force_transport = *kind;
  }
  o.tcp_connections_per_peer = static_cast<int>(tcp_connections_per_peer);
  o.tcp_threads_per_peer = static_cast<int>(tcp_threads_per_peer);
  o.enable_rdma = rdma_enable;
  o.rdma_qps_per_peer = static_cast<int>(rdma_qps_per_peer);
  o.enable_cuda = cuda_enable;
  o.connect_timeout = connect_timeout;
  return o;
}

void CacheSection::Register(ConfigSchema& schema) {
  schema.AddString("cache.listen", &listen, "gRPC address of the cache server (host:port)");
  schema.AddString("cache.http_listen", &http_listen,
                   "Address for /metrics and /healthz; empty turns HTTP off");
  schema.AddString("cache.transfer_listen", &transfer_listen,
                   "Data-plane (transfer engine tcp) address of the DRAM segment; empty: off");
  schema.AddString("cache.shm_socket", &shm_socket,
                   "Unix socket through which same-host clients map the DRAM arena; empty: off");
  schema.AddString("cache.server_id", &server_id, "Node id of this cache server (KV events)");
  schema.AddString("cache.host_id", &host_id,
                   "Host identity for same-host (shm) transfers; empty: the host name");
  schema.AddString("cache.data_dir", &data_dir, "Directory of the RocksDB index (and SSD tier)");
  schema.AddBytes("cache.slot_bytes", &slot_bytes,
                  "Bytes per block slot (largest block payload), a multiple of 4096");
  schema.AddBytes("cache.dram.capacity", &dram_capacity, "DRAM tier capacity");
  schema.AddBytes("cache.dram.max", &dram_max,
                  "Largest DRAM capacity set-capacity may grow to; 0: the capacity");
  schema.AddBool("cache.dram.prefault", &dram_prefault,
                 "Back the DRAM capacity's pages at start (no page faults on the data path)");
  schema.AddDouble("cache.dram.high_watermark", &dram_high_watermark,
                   "Fraction of DRAM slots in use that starts eviction");
  schema.AddDouble("cache.dram.low_watermark", &dram_low_watermark,
                   "Fraction of DRAM slots eviction brings usage down to");
  schema.AddString("cache.ssd.dir", &ssd_dir,
                   "Directory of the SSD slot files; empty: data_dir/ssd");
  schema.AddBytes("cache.ssd.capacity", &ssd_capacity, "SSD tier capacity; 0 disables the tier");
  schema.AddBytes("cache.ssd.max", &ssd_max,
                  "SSD bytes preallocated (the most set-capacity may grow to); 0: the capacity");
  schema.AddInt("cache.ssd.slots_per_file", &ssd_slots_per_file, "Slots per SSD slot file", 1,
                1 << 20);
  schema.AddDouble("cache.ssd.high_watermark", &ssd_high_watermark,
                   "Fraction of SSD slots in use that starts eviction");
  schema.AddDouble("cache.ssd.low_watermark", &ssd_low_watermark,
                   "Fraction of SSD slots eviction brings usage down to");
  schema.AddEnum("cache.write_policy", &write_policy, {"write_through", "on_evict", "never"},
                 "When DRAM blocks are written to SSD");
  schema.AddDuration("cache.lease_ttl", &lease_ttl,
                     "How long a lease lives without KeepAlive (a dead client's slots come back)");
  schema.AddDuration("cache.digest_interval", &digest_interval,
                     "Period of the full-state digest on KV event streams");
  schema.AddInt("cache.event_log", &event_log,
                "KV events kept for subscribers that resume from a sequence (workers following "
                "evictions); one that falls further behind resyncs from the digest",
                1, int64_t{1} << 24);
  schema.AddStringList("cache.tenant_quotas", &tenant_quotas,
                       "Per-tenant byte quotas, tenant=size (e.g. acme=100GiB)");
}

void WorkerSection::Register(ConfigSchema& schema) {
  schema.AddEnum("worker.role", &role, {"prefill", "decode", "both"},
                 "What the worker serves: prefill, decode, or both (one node does everything)");
  schema.AddString("worker.model", &model, "Hugging Face model directory");
  schema.AddEnum("worker.backend", &backend, {"cpu", "cuda"}, "Compute backend");
  schema.AddString("worker.node_id", &node_id, "Node id (scheduler, cache leases, logs)");
  schema.AddString("worker.listen", &listen, "gRPC address of the Worker service (host:port)");
  schema.AddString("worker.http_listen", &http_listen,
                   "Address for /metrics and /healthz; empty turns HTTP off");
  schema.AddString("worker.host_id", &host_id,
                   "Host identity for same-host (shm) transfers; empty: the host name");
  schema.AddString("worker.cache_address", &cache_address,
                   "gRPC address of this host's cache server; empty: no cache (recompute)");
  schema.AddString("worker.scheduler_address", &scheduler_address,
                   "gRPC address of the scheduler to register with; empty: standalone");
  schema.AddInt("worker.kv_pages", &kv_pages, "KV pool size in pages (one block each)", 2,
                int64_t{1} << 24);
  schema.AddInt("worker.block_tokens", &block_tokens, "Tokens per block and page", 16, 1024);
  schema.AddEnum("worker.kv_precision", &kv_precision, {"bf16", "fp32"},
                 "Precision of the KV pool (bf16: cached blocks restore bit-exactly)");
  schema.AddEnum("worker.cache_codec", &cache_codec, {"bf16", "fp8"},
                 "Codec of the KV blocks saved to and loaded from the cache (fp8: half the bytes "
                 "in every tier and on the wire, at fp8 precision; every worker of a cluster "
                 "must agree)");
  schema.AddBool("worker.cache_read_in_place", &cache_read_in_place,
                 "cuda backend, cache server on this host (shm): the GPU reads cached blocks in "
                 "the server's shared memory (registered with CUDA in the background on first "
                 "use); false: they are copied into a pinned buffer first");
  schema.AddBool("worker.resident_blocks", &resident_blocks,
                 "Keep the full KV blocks of ended and swapped-out sequences in the KV pool, "
                 "found again by key, until their pages are needed: a prompt that starts with "
                 "them uses them without fetching anything; false: free the pages at once");
  schema.AddInt("worker.token_budget", &token_budget,
                "Tokens per engine step (decode tokens + prefill chunks)", 1, 1 << 20);
  schema.AddInt("worker.max_running", &max_running, "Sequences holding KV pages at once", 1,
                1 << 16);
  schema.AddInt("worker.max_queued", &max_queued, "Waiting requests before refusing more", 1,
                1 << 24);
  schema.AddDouble("worker.fault.corrupt", &fault_corrupt,
                   "Tests: probability that a cache transfer is corrupted");
  schema.AddDouble("worker.fault.delay", &fault_delay,
                   "Tests: probability that a cache transfer is delayed");
  schema.AddDuration("worker.fault.delay_by", &fault_delay_by, "Tests: the delay");
}

void SchedulerSection::Register(ConfigSchema& schema) {
  schema.AddString("scheduler.listen", &listen,
                   "gRPC address of the Scheduler service workers register with (host:port)");
  schema.AddString("scheduler.http_listen", &http_listen,
                   "Address of the OpenAI-compatible HTTP gateway; empty turns it off");
  schema.AddEnum("scheduler.policy", &policy,
                 {"random", "round_robin", "least_loaded", "cache_aware_local", "strata"},
                 "Placement policy");
  schema.AddString(
      "scheduler.model", &model,
      "Model directory for the tokenizer and chat template (its name is the model id)");
  schema.AddDuration("scheduler.heartbeat_interval", &heartbeat_interval,
                     "How often workers report their load");
  schema.AddInt("scheduler.missed_heartbeats", &missed_heartbeats,
                "Heartbeats a node may miss before it is marked dead", 1, 1000);
  schema.AddInt("scheduler.http_threads", &http_threads, "Threads of the HTTP gateway", 1, 256);
  schema.AddString("scheduler.api_keys_file", &api_keys_file,
                   "File with the gateway's bearer API keys, one a line; empty: no keys needed");
  schema.AddDuration("scheduler.request_timeout", &request_timeout,
                     "Longest a request may run on the workers");
}

void StrataConfig::Register(ConfigSchema& schema) {
  log.Register(schema);
  cluster.Register(schema);
  transfer.Register(schema);
  cache.Register(schema);
  worker.Register(schema);
  scheduler.Register(schema);
  up.Register(schema);
}

void UpSection::Register(ConfigSchema& schema) {
  schema.AddString("up.run_dir", &run_dir,
                   "Directory for logs, data, the model and the effective config (strata up)");
  schema.AddString("up.model", &model,
                   "Model directory, or a preset (tiny, small-v3, ...) made under run_dir/models");
  schema.AddInt("up.model_seed", &model_seed, "Seed of a preset model made on first run", 0,
                int64_t{1} << 62);
  schema.AddInt("up.prefill_workers", &prefill_workers, "Prefill-only workers", 0, 64);
  schema.AddInt("up.decode_workers", &decode_workers, "Decode-only workers", 0, 64);
  schema.AddInt("up.workers", &workers, "Workers that do both prefill and decode", 0, 64);
  schema.AddInt("up.http_port", &http_port, "Port of the OpenAI gateway on 127.0.0.1; 0: any", 0,
                65535);
  schema.AddDuration("up.start_timeout", &start_timeout,
                     "How long a daemon may take to become ready");
  schema.AddDuration("up.stop_timeout", &stop_timeout,
                     "How long a daemon may take to stop before it is killed");
  schema.AddDuration("up.max_backoff", &max_backoff,
                     "Longest wait before restarting a daemon that keeps crashing");
}

}  // namespace strata
