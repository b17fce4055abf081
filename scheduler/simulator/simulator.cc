#include "scheduler/simulator/simulator.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <queue>

#include "common/check.h"
#include "common/status.h"
#include "common/strings.h"
#include "scheduler/simulator/node_cache.h"

namespace strata::scheduler::sim {

namespace {

enum class EventKind { kArrival, kPrefillDone, kDecodeJoin, kDecodeStep, kHeartbeat };

struct Event {
  double time;
  uint64_t seq;
  EventKind kind;
  uint32_t a;  // request or node
  bool operator>(const Event& o) const { return time != o.time ? time > o.time : seq > o.seq; }
};

struct RequestState {
  std::vector<BlockKey> keys;
  Placement placement;
  double compute_s = 0;
  double first_token_s = 0;
  uint32_t remaining_tokens = 0;
  uint64_t context_tokens = 0;
};

struct PrefillNode {
  std::unique_ptr<NodeCache> cache;
  std::deque<uint32_t> queue;
  int64_t running = -1;
  double ms_per_token = 0;
};

struct DecodeNode {
  std::vector<uint32_t> active;
  std::vector<uint32_t> joining;
  std::deque<uint32_t> waiting;
  uint64_t kv_used = 0;
  uint64_t context_tokens = 0;
  bool stepping = false;
  double last_step_s = 0;
};

absl::Time SimTime(double seconds) { return absl::UnixEpoch() + absl::Seconds(seconds); }

class Simulation {
 public:
  Simulation(const std::vector<TraceRequest>& trace, const SimulationOptions& options,
             std::unique_ptr<Scheduler> scheduler)
      : trace_(trace),
        options_(options),
        cluster_(options.cluster),
        scheduler_(std::move(scheduler)),
        states_(trace.size()) {
    result_.policy = options.policy;
    result_.requests.resize(trace.size());
  }

  absl::StatusOr<SimulationResult> Run();

 private:
  void Push(double time, EventKind kind, uint32_t a) {
    events_.push(Event{time, next_seq_++, kind, a});
  }
  absl::Status Arrive(uint32_t r);
  void StartPrefill(uint32_t node);
  void FinishPrefill(uint32_t node);
  void JoinDecode(uint32_t r);
  void DecodeStep(uint32_t decode);
  void MaybeStartStep(uint32_t decode);
  void Heartbeat();
  bool Admit(DecodeNode& d, uint32_t r);

  const std::vector<TraceRequest>& trace_;
  const SimulationOptions& options_;
  const ClusterModel& cluster_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<RequestState> states_;
  std::vector<PrefillNode> prefill_;
  std::vector<DecodeNode> decode_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t next_seq_ = 0;
  double now_ = 0;
  uint64_t in_flight_ = 0;
  size_t arrived_ = 0;
  SimulationResult result_;
};

absl::StatusOr<SimulationResult> Simulation::Run() {
  const uint32_t p_count = cluster_.prefill_nodes, d_count = cluster_.decode_nodes;
  if (p_count == 0 || d_count == 0) {
    return absl::InvalidArgumentError("the cluster needs at least one prefill and one decode node");
  }
  std::array<uint64_t, kNumTiers> capacity_blocks;
  for (int t = 0; t < kNumTiers; ++t) {
    capacity_blocks[t] = cluster_.cache_tokens[t] / cluster_.block_tokens;
  }
  for (uint32_t i = 0; i < p_count; ++i) {
    const NodeIndex index = scheduler_->load().Register(StrCat("prefill-", i), StrCat("host-p", i),
                                                        NodeRoleKind::kPrefill, SimTime(0));
    STRATA_CHECK(index == i, "simulated nodes register in order");
    PrefillNode node;
    node.cache = std::make_unique<NodeCache>(index, capacity_blocks, &scheduler_->index());
    prefill_.push_back(std::move(node));
  }
  for (uint32_t i = 0; i < d_count; ++i) {
    scheduler_->load().Register(StrCat("decode-", i), StrCat("host-d", i), NodeRoleKind::kDecode,
                                SimTime(0));
  }
  decode_.resize(d_count);
  for (uint32_t r = 0; r < trace_.size(); ++r) Push(trace_[r].arrival_s, EventKind::kArrival, r);
  Push(0, EventKind::kHeartbeat, 0);

  while (!events_.empty()) {
    const Event e = events_.top();
    events_.pop();
    now_ = e.time;
    switch (e.kind) {
      case EventKind::kArrival:
        RETURN_IF_ERROR(Arrive(e.a));
        break;
      case EventKind::kPrefillDone:
        FinishPrefill(e.a);
        break;
      case EventKind::kDecodeJoin:
        JoinDecode(e.a);
        break;
      case EventKind::kDecodeStep:
        DecodeStep(e.a);
        break;
      case EventKind::kHeartbeat:
        Heartbeat();
        if (arrived_ < trace_.size() || in_flight_ > 0) {
          Push(now_ + cluster_.heartbeat_interval_s, EventKind::kHeartbeat, 0);
        }
        break;
    }
  }
  result_.makespan_s = now_;
  result_.calibrated_prefill = scheduler_->prefill_model();
  return std::move(result_);
}

absl::Status Simulation::Arrive(uint32_t r) {
  ++arrived_;
  const TraceRequest& t = trace_[r];
  RequestState& s = states_[r];
  RequestOutcome& out = result_.requests[r];
  out.arrival_s = t.arrival_s;
  out.prompt_tokens = t.input_tokens;
  out.output_tokens = t.output_tokens;
  s.keys = FullBlockKeys(t, cluster_.block_tokens);
  PlacementRequest request;
  request.keys = s.keys;
  request.block_tokens = cluster_.block_tokens;
  request.prompt_tokens = t.input_tokens;
  request.max_output_tokens = t.output_tokens;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Placement> placement = scheduler_->Decide(request);
  result_.decision_us.push_back(
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  RETURN_IF_ERROR_WITH(placement.status(), "placing trace request ", r);
  if (placement->rejected) {
    out.rejected = true;
    return absl::OkStatus();
  }
  s.placement = *std::move(placement);
  ++in_flight_;
  PrefillNode& node = prefill_[s.placement.prefill];
  node.queue.push_back(r);
  if (node.running < 0) StartPrefill(s.placement.prefill);
  return absl::OkStatus();
}

void Simulation::StartPrefill(uint32_t n) {
  PrefillNode& node = prefill_[n];
  if (node.queue.empty()) return;
  const uint32_t r = node.queue.front();
  node.queue.pop_front();
  node.running = r;
  RequestState& s = states_[r];
  const TraceRequest& t = trace_[r];
  // What the node really holds now (it may differ from what the index said at placement).
  const NodePrefix local = node.cache->Prefix(s.keys);
  uint32_t cached_blocks = local.blocks;
  double load_s = cluster_.tiers.LoadSeconds(local.tiers, cluster_.block_tokens, false);
  if (s.placement.move.has_value() && s.placement.move->source < prefill_.size()) {
    NodeCache& source = *prefill_[s.placement.move->source].cache;
    const NodePrefix remote = source.Prefix(s.keys);
    if (remote.blocks > cached_blocks) {
      const std::span<const BlockKey> range(s.keys.data() + cached_blocks,
                                            remote.blocks - cached_blocks);
      load_s += cluster_.tiers.LoadSeconds(source.Tiers(range), cluster_.block_tokens, true);
      source.Touch(range);
      result_.moved_blocks += range.size();
      cached_blocks = remote.blocks;
    }
  }
  const uint64_t cached_tokens =
      std::min<uint64_t>(uint64_t(cached_blocks) * cluster_.block_tokens, t.input_tokens);
  const uint64_t new_tokens = t.input_tokens - cached_tokens;
  s.compute_s = cluster_.prefill.Predict(double(new_tokens), double(cached_tokens));
  result_.requests[r].cached_tokens = cached_tokens;
  if (new_tokens > 0) {
    const double ms = s.compute_s * 1000 / double(new_tokens);
    node.ms_per_token = node.ms_per_token == 0 ? ms : 0.8 * node.ms_per_token + 0.2 * ms;
  }
  Push(now_ + load_s + s.compute_s, EventKind::kPrefillDone, n);
}

void Simulation::FinishPrefill(uint32_t n) {
  PrefillNode& node = prefill_[n];
  const auto r = static_cast<uint32_t>(node.running);
  node.running = -1;
  RequestState& s = states_[r];
  const TraceRequest& t = trace_[r];
  node.cache->Use(s.keys);
  // The scheduler learns what was really computed (the node may have held more or less).
  const uint64_t cached = result_.requests[r].cached_tokens;
  scheduler_->ReportPrefillDone(s.placement, t.input_tokens - cached, cached, s.compute_s);
  result_.requests[r].ttft_s = now_ - t.arrival_s;
  s.first_token_s = now_;
  s.context_tokens = t.input_tokens + t.output_tokens;
  if (t.output_tokens <= 1) {
    scheduler_->ReportDecodeDone(s.placement, s.context_tokens);
    --in_flight_;
  } else {
    s.remaining_tokens = t.output_tokens - 1;
    const double transfer = double(t.input_tokens) * cluster_.tiers.kv_bytes_per_token /
                            cluster_.tiers.network_bandwidth;
    Push(now_ + transfer, EventKind::kDecodeJoin, r);
  }
  StartPrefill(n);
}

bool Simulation::Admit(DecodeNode& d, uint32_t r) {
  const RequestState& s = states_[r];
  if (!d.active.empty() && d.kv_used + s.context_tokens > cluster_.decode_kv_tokens) return false;
  d.kv_used += s.context_tokens;
  d.context_tokens += trace_[r].input_tokens;
  d.active.push_back(r);
  return true;
}

void Simulation::JoinDecode(uint32_t r) {
  const uint32_t d = states_[r].placement.decode - cluster_.prefill_nodes;
  DecodeNode& node = decode_[d];
  if (node.stepping) {
    node.joining.push_back(r);
  } else if (!Admit(node, r)) {
    node.waiting.push_back(r);
  }
  MaybeStartStep(d);
}

void Simulation::MaybeStartStep(uint32_t d) {
  DecodeNode& node = decode_[d];
  if (node.stepping || node.active.empty()) return;
  node.stepping = true;
  node.last_step_s =
      cluster_.decode.StepSeconds(double(node.active.size()), double(node.context_tokens));
  Push(now_ + node.last_step_s, EventKind::kDecodeStep, d);
}

void Simulation::DecodeStep(uint32_t d) {
  DecodeNode& node = decode_[d];
  node.stepping = false;
  std::vector<uint32_t> still;
  still.reserve(node.active.size());
  for (uint32_t r : node.active) {
    RequestState& s = states_[r];
    ++node.context_tokens;
    if (--s.remaining_tokens > 0) {
      still.push_back(r);
      continue;
    }
    const TraceRequest& t = trace_[r];
    result_.requests[r].tbt_s = (now_ - s.first_token_s) / double(t.output_tokens - 1);
    node.kv_used -= s.context_tokens;
    node.context_tokens -= t.input_tokens + (t.output_tokens - 1);
    scheduler_->ReportDecodeDone(s.placement, s.context_tokens);
    --in_flight_;
  }
  node.active = std::move(still);
  for (uint32_t r : node.joining) {
    if (!Admit(node, r)) node.waiting.push_back(r);
  }
  node.joining.clear();
  while (!node.waiting.empty() && Admit(node, node.waiting.front())) node.waiting.pop_front();
  MaybeStartStep(d);
}

void Simulation::Heartbeat() {
  const absl::Time now = SimTime(now_);
  for (uint32_t i = 0; i < prefill_.size(); ++i) {
    const PrefillNode& node = prefill_[i];
    NodeLoad load;
    load.queued_requests = uint32_t(node.queue.size());
    for (uint32_t r : node.queue) load.queued_prefill_tokens += states_[r].placement.new_tokens;
    load.running_requests = node.running >= 0 ? 1 : 0;
    load.prefill_ms_per_token = node.ms_per_token;
    (void)scheduler_->load().Heartbeat(StrCat("prefill-", i), load, now);
  }
  for (uint32_t i = 0; i < decode_.size(); ++i) {
    const DecodeNode& node = decode_[i];
    NodeLoad load;
    load.running_requests = uint32_t(node.active.size());
    load.queued_requests = uint32_t(node.waiting.size() + node.joining.size());
    load.running_tokens = node.context_tokens;
    load.total_kv_pages = uint32_t(cluster_.decode_kv_tokens / 64);
    load.free_kv_pages = uint32_t(
        (cluster_.decode_kv_tokens - std::min(node.kv_used, cluster_.decode_kv_tokens)) / 64);
    load.decode_batch_size = uint32_t(node.active.size());
    load.decode_step_ms = node.last_step_s * 1000;
    (void)scheduler_->load().Heartbeat(StrCat("decode-", i), load, now);
  }
  scheduler_->load().CheckLiveness(now);
}

}  // namespace

absl::StatusOr<SimulationResult> Simulate(const std::vector<TraceRequest>& trace,
                                          const SimulationOptions& options) {
  SchedulerOptions scheduler_options;
  scheduler_options.policy = options.policy;
  scheduler_options.seed = options.seed;
  scheduler_options.models.prefill = options.prefill_prior;
  scheduler_options.models.decode = options.cluster.decode;
  scheduler_options.models.tiers = options.cluster.tiers;
  scheduler_options.objectives = options.objectives;
  scheduler_options.heartbeat_interval = absl::Seconds(options.cluster.heartbeat_interval_s);
  ASSIGN_OR_RETURN(auto scheduler, Scheduler::Create(scheduler_options));
  Simulation simulation(trace, options, std::move(scheduler));
  return simulation.Run();
}

}  // namespace strata::scheduler::sim
