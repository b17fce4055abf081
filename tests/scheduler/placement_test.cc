#include <gtest/gtest.h>

#include "scheduler/placement/baseline_policies.h"
#include "scheduler/placement/policy.h"
#include "scheduler/placement/strata_policy.h"
#include "scheduler/scheduler.h"
#include "tests/scheduler/test_keys.h"

namespace strata::scheduler {
namespace {

using testing_keys::Chain;

// A cluster of `prefill` prefill nodes (0..p-1) and `decode` decode nodes after them.
std::vector<NodeView> Cluster(uint32_t prefill, uint32_t decode) {
  std::vector<NodeView> nodes;
  for (uint32_t i = 0; i < prefill + decode; ++i) {
    NodeView n;
    n.index = i;
    n.id = "n" + std::to_string(i);
    n.role = i < prefill ? NodeRoleKind::kPrefill : NodeRoleKind::kDecode;
    nodes.push_back(n);
  }
  return nodes;
}

struct Fixture {
  std::vector<NodeView> nodes;
  PrefixIndex index{10000};
  std::vector<BlockKey> keys = Chain(0, 32);
  PrefixMatch match;
  PlacementRequest request;
  PlacementContext context;

  Fixture(uint32_t prefill, uint32_t decode) : nodes(Cluster(prefill, decode)) {
    request.block_tokens = 512;
    request.prompt_tokens = 32 * 512;
    request.max_output_tokens = 100;
    context.objectives.ttft_s = 5;
    context.objectives.tbt_s = 0.1;
  }
  PlacementContext& Ready() {
    request.keys = keys;
    match = index.Match(keys);
    context.nodes = nodes;
    context.match = &match;
    return context;
  }
};

TEST(PlacementTest, MakePolicyKnowsEveryNameAndRejectsOthers) {
  for (const std::string& name : PolicyNames()) {
    auto policy = MakePolicy(name);
    ASSERT_TRUE(policy.ok()) << name;
    EXPECT_EQ((*policy)->name(), name);
  }
  EXPECT_TRUE(absl::IsInvalidArgument(MakePolicy("fastest").status()));
}

TEST(PlacementTest, EveryPolicySkipsDeadAndDrainingNodes) {
  for (const std::string& name : PolicyNames()) {
    Fixture f(3, 2);
    f.nodes[0].alive = false;
    f.nodes[1].draining = true;
    f.nodes[3].alive = false;
    auto policy = *MakePolicy(name);
    for (int i = 0; i < 10; ++i) {
      auto placement = policy->Place(f.request, f.Ready());
      ASSERT_TRUE(placement.ok()) << name;
      EXPECT_EQ(placement->prefill, 2u) << name;
      EXPECT_EQ(placement->decode, 4u) << name;
    }
  }
}

TEST(PlacementTest, NoCandidateIsUnavailable) {
  for (const std::string& name : PolicyNames()) {
    Fixture f(2, 1);
    f.nodes[0].alive = f.nodes[1].alive = false;
    auto policy = *MakePolicy(name);
    EXPECT_TRUE(absl::IsUnavailable(policy->Place(f.request, f.Ready()).status())) << name;
  }
}

TEST(PlacementTest, RoundRobinCycles) {
  Fixture f(3, 1);
  RoundRobinPolicy policy;
  std::vector<NodeIndex> order;
  for (int i = 0; i < 6; ++i) order.push_back(policy.Place(f.request, f.Ready())->prefill);
  EXPECT_EQ(order, (std::vector<NodeIndex>{0, 1, 2, 0, 1, 2}));
}

TEST(PlacementTest, RandomUsesEveryCandidate) {
  Fixture f(4, 1);
  RandomPolicy policy(3);
  std::set<NodeIndex> seen;
  for (int i = 0; i < 200; ++i) seen.insert(policy.Place(f.request, f.Ready())->prefill);
  EXPECT_EQ(seen.size(), 4u);
}

TEST(PlacementTest, LeastLoadedPicksFewestOutstandingTokens) {
  Fixture f(3, 2);
  f.nodes[0].outstanding.prefill_tokens = 5000;
  f.nodes[1].outstanding.prefill_tokens = 100;
  f.nodes[2].outstanding.prefill_tokens = 3000;
  f.nodes[3].outstanding.decode_tokens = 9000;
  LeastLoadedPolicy policy;
  auto placement = policy.Place(f.request, f.Ready());
  EXPECT_EQ(placement->prefill, 1u);
  EXPECT_EQ(placement->decode, 4u);
}

TEST(PlacementTest, PlacementReportsLocallyCachedTokens) {
  Fixture f(2, 1);
  f.index.Stored(0, CacheTier::kDram, std::span<const BlockKey>(f.keys.data(), 10));
  f.nodes[1].outstanding.prefill_tokens = 1;  // least_loaded picks node 0
  LeastLoadedPolicy policy;
  auto placement = policy.Place(f.request, f.Ready());
  ASSERT_EQ(placement->prefill, 0u);
  EXPECT_EQ(placement->local_blocks, 10u);
  EXPECT_EQ(placement->local_tiers[1], 10u);
  EXPECT_EQ(placement->cached_tokens, 10u * 512);
  EXPECT_EQ(placement->new_tokens, 22u * 512);
  EXPECT_FALSE(placement->move.has_value());
}

TEST(PlacementTest, CacheAwareLocalFollowsTheCacheUnlessImbalanced) {
  Fixture f(3, 1);
  f.index.Stored(2, CacheTier::kGpu, std::span<const BlockKey>(f.keys.data(), 20));
  CacheAwareLocalPolicy policy;
  EXPECT_EQ(policy.Place(f.request, f.Ready())->prefill, 2u);
  // Node 2 is far busier than the others: balance wins.
  f.nodes[2].outstanding.prefill_requests = 20;
  f.nodes[0].outstanding.prefill_requests = 1;
  f.nodes[1].outstanding.prefill_requests = 2;
  EXPECT_EQ(policy.Place(f.request, f.Ready())->prefill, 0u);
}

TEST(PlacementTest, StrataPrefersTheCachedNodeWhenItsQueueIsShort) {
  Fixture f(3, 1);
  f.index.Stored(1, CacheTier::kGpu, std::span<const BlockKey>(f.keys.data(), 30));
  f.nodes[1].outstanding.prefill_seconds = 0.001;
  StrataPolicy policy;
  auto placement = policy.Place(f.request, f.Ready());
  EXPECT_EQ(placement->prefill, 1u);
  EXPECT_FALSE(placement->move.has_value());
  EXPECT_EQ(placement->cached_tokens, 30u * 512);
  EXPECT_GT(placement->predicted_ttft_s, 0.001);
  // A longer queue there makes copying the blocks to an idle node the better plan.
  f.nodes[1].outstanding.prefill_seconds = 0.1;
  placement = policy.Place(f.request, f.Ready());
  EXPECT_NE(placement->prefill, 1u);
  ASSERT_TRUE(placement->move.has_value());
  EXPECT_EQ(placement->move->source, 1u);
}

TEST(PlacementTest, StrataMovesBlocksWhenTheHolderIsBusy) {
  Fixture f(3, 1);
  f.index.Stored(1, CacheTier::kDram, std::span<const BlockKey>(f.keys.data(), 30));
  f.nodes[1].outstanding.prefill_seconds = 30;  // the holder is swamped
  f.nodes[0].outstanding.prefill_seconds = 0.5;
  StrataPolicy policy;
  auto placement = policy.Place(f.request, f.Ready());
  EXPECT_EQ(placement->prefill, 2u);
  ASSERT_TRUE(placement->move.has_value());
  EXPECT_EQ(placement->move->source, 1u);
  EXPECT_EQ(placement->move->first_block, 0u);
  EXPECT_EQ(placement->move->num_blocks, 30u);
  EXPECT_EQ(placement->cached_tokens, 30u * 512);
  EXPECT_LT(placement->predicted_ttft_s, 30);
}

TEST(PlacementTest, StrataAvoidsALongQueueEvenWithACacheHit) {
  Fixture f(2, 1);
  f.index.Stored(0, CacheTier::kGpu, std::span<const BlockKey>(f.keys.data(), 4));
  f.nodes[0].outstanding.prefill_seconds = 60;
  StrataPolicy policy;
  // Node 1 either recomputes or moves the 4 blocks; both beat a 60 s queue.
  EXPECT_EQ(policy.Place(f.request, f.Ready())->prefill, 1u);
}

TEST(PlacementTest, StrataRejectsWhenTtftObjectiveCannotBeMet) {
  Fixture f(2, 1);
  f.nodes[0].outstanding.prefill_seconds = 100;
  f.nodes[1].outstanding.prefill_seconds = 120;
  f.context.objectives.reject_factor = 2;  // reject above 10 s
  StrataPolicy policy;
  auto placement = policy.Place(f.request, f.Ready());
  ASSERT_TRUE(placement.ok());
  EXPECT_TRUE(placement->rejected);
  EXPECT_GE(placement->retry_after_s, 1);
  EXPECT_FALSE(placement->reject_reason.empty());
  // Without rejection the same request is placed.
  f.context.objectives.reject_factor = 0;
  EXPECT_FALSE(policy.Place(f.request, f.Ready())->rejected);
}

TEST(PlacementTest, StrataPicksDecodeByTbtHeadroomAndFreePages) {
  Fixture f(1, 3);
  // Node 1: busy batch; node 2: idle but out of pages; node 3: moderately loaded, room.
  f.nodes[1].outstanding.decode_requests = 200;
  f.nodes[1].outstanding.decode_tokens = 40'000'000;
  f.nodes[2].load.total_kv_pages = 1000;
  f.nodes[2].load.free_kv_pages = 10;
  f.nodes[3].outstanding.decode_requests = 20;
  f.nodes[3].outstanding.decode_tokens = 200'000;
  f.nodes[3].load.total_kv_pages = 100000;
  f.nodes[3].load.free_kv_pages = 90000;
  StrataPolicy policy;
  auto placement = policy.Place(f.request, f.Ready());
  EXPECT_EQ(placement->decode, 3u);
  EXPECT_LE(placement->predicted_tbt_s, 0.1);
  // When no decode node meets the TBT objective and rejection is on, reject.
  f.nodes[3].outstanding.decode_tokens = 60'000'000;
  f.context.objectives.reject_factor = 2;
  EXPECT_TRUE(policy.Place(f.request, f.Ready())->rejected);
}

// Two decode nodes about as fast: the one whose own pool (GPU tier) holds the prompt's prefix
// gets it, unless that costs more than the TBT slack.
TEST(PlacementTest, StrataSendsDecodeWhereThePromptIsResident) {
  Fixture f(1, 2);
  f.index.Stored(1, CacheTier::kDram, f.keys);
  f.index.Stored(2, CacheTier::kDram, f.keys);
  f.index.Stored(2, CacheTier::kGpu, std::span<const BlockKey>(f.keys.data(), 20));
  f.nodes[2].outstanding.decode_requests = 1;  // a little busier than node 1
  f.nodes[2].outstanding.decode_tokens = 1000;
  StrataPolicy policy;
  auto placement = policy.Place(f.request, f.Ready());
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->decode, 2u);
  // Much busier: the faster node wins despite the resident prefix.
  f.nodes[2].outstanding.decode_requests = 100;
  f.nodes[2].outstanding.decode_tokens = 20'000'000;
  placement = policy.Place(f.request, f.Ready());
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->decode, 1u);
}

// A request's KV bytes per token (its model's layers, its cache codec) price its block loads.
TEST(SchedulerTest, BlockLoadsArePricedByTheRequestsKvSize) {
  SchedulerOptions options;
  options.policy = "strata";
  auto scheduler = *Scheduler::Create(options);
  const absl::Time t0 = absl::UnixEpoch();
  scheduler->load().Register("b0", "h0", NodeRoleKind::kBoth, t0);
  const auto keys = Chain(0, 8);
  scheduler->index().Stored(0, CacheTier::kSsd, keys);
  PlacementRequest request;
  request.keys = keys;
  request.block_tokens = 64;
  request.prompt_tokens = 8 * 64 + 10;
  request.max_output_tokens = 4;
  const double fixed = options.models.tiers.fixed_latency_s;
  std::vector<double> load;
  for (const double bytes : {0.0, 70272.0, 40016.0}) {  // default; V3 bf16; V3 fp8 (61 x 656)
    request.kv_bytes_per_token = bytes;
    const Placement p = *scheduler->Decide(request);
    EXPECT_EQ(p.cached_tokens, 8u * 64) << bytes;
    load.push_back(p.predicted_load_s - fixed);
    scheduler->ReportPrefillDone(p, p.new_tokens, p.cached_tokens, 0);
    scheduler->ReportDecodeDone(p, request.prompt_tokens + request.max_output_tokens);
  }
  ASSERT_GT(load[1], 0);
  EXPECT_DOUBLE_EQ(load[0], load[1]);  // the default is V3 in bf16
  EXPECT_NEAR(load[2] / load[1], 40016.0 / 70272.0, 1e-9);
}

TEST(SchedulerTest, DecideBooksWorkAndReportsReleaseIt) {
  SchedulerOptions options;
  options.policy = "least_loaded";
  auto scheduler = *Scheduler::Create(options);
  const absl::Time t0 = absl::UnixEpoch();
  scheduler->load().Register("p0", "h0", NodeRoleKind::kPrefill, t0);
  scheduler->load().Register("p1", "h1", NodeRoleKind::kPrefill, t0);
  scheduler->load().Register("d0", "h2", NodeRoleKind::kDecode, t0);
  const auto keys = Chain(0, 8);
  PlacementRequest request;
  request.keys = keys;
  request.block_tokens = 64;
  request.prompt_tokens = 8 * 64;
  request.max_output_tokens = 16;
  auto first = *scheduler->Decide(request);
  auto second = *scheduler->Decide(request);
  EXPECT_NE(first.prefill, second.prefill);  // the first booking is visible to the second
  const auto nodes = scheduler->load().Snapshot();
  EXPECT_EQ(nodes[first.prefill].outstanding.prefill_tokens, 512u);
  EXPECT_EQ(nodes[2].outstanding.decode_requests, 2u);
  scheduler->ReportPrefillDone(first, 512, 0, 0.05);
  scheduler->ReportDecodeDone(first, 8 * 64 + 16);
  EXPECT_EQ(scheduler->load().Snapshot()[first.prefill].outstanding.prefill_tokens, 0u);
  EXPECT_EQ(scheduler->load().Snapshot()[2].outstanding.decode_requests, 1u);

  EXPECT_EQ(scheduler->policy_name(), "least_loaded");
  ASSERT_TRUE(scheduler->SetPolicy("strata").ok());
  EXPECT_EQ(scheduler->policy_name(), "strata");
  EXPECT_TRUE(absl::IsInvalidArgument(scheduler->SetPolicy("nope")));
  EXPECT_EQ(scheduler->policy_name(), "strata");
}

}  // namespace
}  // namespace strata::scheduler
