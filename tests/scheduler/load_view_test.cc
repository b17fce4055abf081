#include "scheduler/load_view.h"

#include <gtest/gtest.h>

namespace strata::scheduler {
namespace {

absl::Time At(double s) { return absl::UnixEpoch() + absl::Seconds(s); }

TEST(LoadViewTest, RegisterAssignsStableIndices) {
  LoadView view;
  EXPECT_EQ(view.Register("a", "h1", NodeRoleKind::kPrefill, At(0)), 0u);
  EXPECT_EQ(view.Register("b", "h2", NodeRoleKind::kDecode, At(0)), 1u);
  EXPECT_EQ(view.Register("a", "h1", NodeRoleKind::kPrefill, At(5)), 0u);
  EXPECT_EQ(view.size(), 2u);
  EXPECT_EQ(*view.Find("b"), 1u);
  EXPECT_TRUE(absl::IsNotFound(view.Find("c").status()));
}

TEST(LoadViewTest, HeartbeatUpdatesLoadAndUnknownNodeIsNotFound) {
  LoadView view;
  view.Register("a", "h", NodeRoleKind::kBoth, At(0));
  NodeLoad load;
  load.queued_requests = 3;
  load.free_kv_pages = 10;
  ASSERT_TRUE(view.Heartbeat("a", load, At(1)).ok());
  EXPECT_EQ(view.Snapshot()[0].load.queued_requests, 3u);
  EXPECT_TRUE(absl::IsNotFound(view.Heartbeat("zzz", load, At(1))));
}

TEST(LoadViewTest, MissedHeartbeatsMarkDeadAndHeartbeatRevives) {
  LoadView view(absl::Seconds(1), 3);
  view.Register("a", "h", NodeRoleKind::kPrefill, At(0));
  view.Register("b", "h", NodeRoleKind::kPrefill, At(0));
  ASSERT_TRUE(view.Heartbeat("b", {}, At(2.5)).ok());
  EXPECT_TRUE(view.CheckLiveness(At(2.9)).empty());
  const auto dead = view.CheckLiveness(At(3.5));
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0], 0u);
  EXPECT_FALSE(view.Snapshot()[0].alive);
  EXPECT_FALSE(view.Snapshot()[0].CanPrefill());
  EXPECT_TRUE(view.CheckLiveness(At(3.6)).empty());  // reported once
  ASSERT_TRUE(view.Heartbeat("a", {}, At(4)).ok());
  EXPECT_TRUE(view.Snapshot()[0].alive);
}

TEST(LoadViewTest, MarkDeadTakesANodeOutUntilItsNextHeartbeat) {
  LoadView view(absl::Seconds(1), 3);
  view.Register("a", "h", NodeRoleKind::kBoth, At(0));
  view.AddPrefill(0, 100, 1.0);
  ASSERT_TRUE(view.MarkDead("a").ok());
  EXPECT_FALSE(view.Snapshot()[0].alive);
  EXPECT_FALSE(view.Snapshot()[0].CanPrefill());
  EXPECT_EQ(view.Snapshot()[0].outstanding.prefill_requests, 0u);
  EXPECT_TRUE(absl::IsNotFound(view.MarkDead("zzz")));
  ASSERT_TRUE(view.Heartbeat("a", {}, At(0.5)).ok());
  EXPECT_TRUE(view.Snapshot()[0].alive);
}

TEST(LoadViewTest, DrainingNodesAreNotCandidates) {
  LoadView view;
  view.Register("a", "h", NodeRoleKind::kBoth, At(0));
  ASSERT_TRUE(view.SetDraining("a", true).ok());
  EXPECT_FALSE(view.Snapshot()[0].CanPrefill());
  EXPECT_FALSE(view.Snapshot()[0].CanDecode());
  ASSERT_TRUE(view.SetDraining("a", false).ok());
  EXPECT_TRUE(view.Snapshot()[0].CanDecode());
  EXPECT_TRUE(absl::IsNotFound(view.SetDraining("x", true)));
}

TEST(LoadViewTest, OutstandingWorkIsBookedAndReleased) {
  LoadView view;
  view.Register("a", "h", NodeRoleKind::kBoth, At(0));
  view.AddPrefill(0, 1000, 0.5);
  view.AddPrefill(0, 500, 0.25);
  view.AddDecode(0, 2000);
  NodeView n = view.Snapshot()[0];
  EXPECT_EQ(n.outstanding.prefill_requests, 2u);
  EXPECT_EQ(n.outstanding.prefill_tokens, 1500u);
  EXPECT_DOUBLE_EQ(n.outstanding.prefill_seconds, 0.75);
  view.FinishPrefill(0, 1000, 0.5);
  view.FinishPrefill(0, 500, 0.25);
  view.FinishPrefill(0, 500, 0.25);  // an extra report does not underflow
  view.FinishDecode(0, 2000);
  n = view.Snapshot()[0];
  EXPECT_EQ(n.outstanding.prefill_requests, 0u);
  EXPECT_EQ(n.outstanding.prefill_tokens, 0u);
  EXPECT_EQ(n.outstanding.prefill_seconds, 0);
  EXPECT_EQ(n.outstanding.decode_tokens, 0u);
}

}  // namespace
}  // namespace strata::scheduler
