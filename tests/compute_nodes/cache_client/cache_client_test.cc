// The cache client against a real cache server in this process (gRPC on loopback, data over tcp
// or shm): round trips, partial hits, duplicates, runs and reads in place, foreign and corrupt
// blocks, metrics and timeouts. Restarts, a dead server, the write-behind queue and a full cache
// are in cache_client_failure_test.cc.
#include "compute_nodes/cache_client/cache_client.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache_service/cache_server.h"
#include "common/metrics.h"
#include "common/strings.h"
#include "tests/compute_nodes/cache_client/cache_client_test_util.h"
#include "transfer/fault/fault_transport.h"

namespace strata::cache_client::testing_util {
namespace {

using transfer::TransportKind;

TEST_F(CacheClientTest, SaveThenFetchRoundTripsOverTcpAndShm) {
  for (const TransportKind kind : {TransportKind::kTcp, TransportKind::kShm}) {
    SCOPED_TRACE(std::string(transfer::TransportKindName(kind)));
    auto client = Connect(Options(kind));
    ASSERT_NE(client, nullptr);
    EXPECT_EQ(client->transport(), kind);
    EXPECT_EQ(client->server_id(), "srv-s");
    const Namespace ns = Ns(std::string(transfer::TransportKindName(kind)));
    const Chain c = MakeChain(ns, 4, 1);

    absl::StatusOr<SaveResult> saved = client->Save(ns, "t", Layout(), c.blocks, "req");
    ASSERT_TRUE(saved.ok()) << saved.status();
    EXPECT_EQ(saved->stored, 4);
    EXPECT_EQ(saved->present, 0);
    EXPECT_EQ(saved->failed, 0);
    EXPECT_TRUE(saved->first_error.ok());
    EXPECT_EQ(saved->keys_in_cache, c.keys);

    const FetchResult r = FetchChain(*client, ns, c);
    EXPECT_EQ(r.hit_blocks, 4);
    EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
    ExpectPayloads(r, c, 4);
    EXPECT_EQ(ActiveLeases(), 0u) << "the read lease outlived Fetch";
  }
}

TEST_F(CacheClientTest, FetchReadsIntoTheCallersBuffer) {
  for (const TransportKind kind : {TransportKind::kTcp, TransportKind::kShm}) {
    SCOPED_TRACE(std::string(transfer::TransportKindName(kind)));
    auto client = Connect(Options(kind));
    ASSERT_NE(client, nullptr);
    const Namespace ns = Ns(std::string("buf-") + std::string(transfer::TransportKindName(kind)));
    const Chain c = MakeChain(ns, 3, 31);
    ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());

    std::shared_ptr<HostBuffer> given;
    size_t asked = 0;
    const FetchResult r =
        client->Fetch(ns, c.keys, c.tokens, Layout(), "req",
                      {.buffer = [&](size_t bytes) -> absl::StatusOr<std::shared_ptr<HostBuffer>> {
                        asked = bytes;
                        given = HostBuffer::Allocate(bytes + 4096);
                        return given;
                      }});
    ExpectPayloads(r, c, 3);
    EXPECT_EQ(asked, 3 * Layout().TotalBytes());
    EXPECT_EQ(r.buffer, given);
    for (const FetchedBlock& b : r.blocks) {
      EXPECT_GE(b.payload.data(), given->data());
      EXPECT_LE(b.payload.data() + b.payload.size(), given->data() + asked);
    }

    // A provider that fails, or gives too little, leaves the fetch on heap memory.
    for (const bool fails : {true, false}) {
      std::shared_ptr<HostBuffer> small;
      const FetchResult h = client->Fetch(
          ns, c.keys, c.tokens, Layout(), "req",
          {.buffer = [&](size_t bytes) -> absl::StatusOr<std::shared_ptr<HostBuffer>> {
            if (fails) return absl::ResourceExhaustedError("no pinned memory");
            small = HostBuffer::Allocate(bytes - 1);
            return small;
          }});
      ExpectPayloads(h, c, 3);
      ASSERT_NE(h.buffer, nullptr);
      EXPECT_NE(h.buffer, small);
      EXPECT_GE(h.buffer->size(), 3 * Layout().TotalBytes());
    }
    EXPECT_EQ(ActiveLeases(), 0u);
  }
}

TEST_F(CacheClientTest, PartialHitReturnsThePresentPrefix) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("partial");
  const Chain c = MakeChain(ns, 5, 2);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), Prefix(c, 2), "req").ok());

  const FetchResult r = FetchChain(*client, ns, c);
  EXPECT_EQ(r.hit_blocks, 2);
  EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
  ExpectPayloads(r, c, 2);

  // A miss is not a failure.
  const Chain other = MakeChain(ns, 3, 3);
  const FetchResult miss = FetchChain(*client, ns, other);
  EXPECT_EQ(miss.hit_blocks, 0);
  EXPECT_TRUE(miss.blocks.empty());
  EXPECT_TRUE(miss.first_failure.ok()) << miss.first_failure;
  // Another namespace does not see these blocks.
  const Namespace ns2 = Ns("partial-2");
  const FetchResult foreign_ns = client->Fetch(ns2, c.keys, c.tokens, Layout(), "req");
  EXPECT_EQ(foreign_ns.hit_blocks, 0);
  EXPECT_EQ(ActiveLeases(), 0u);
}

TEST_F(CacheClientTest, SavingPresentBlocksCountsThemPresent) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("present");
  const Chain c = MakeChain(ns, 5, 4);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), Prefix(c, 3), "req").ok());

  absl::StatusOr<SaveResult> again = client->Save(ns, "t", Layout(), Prefix(c, 3), "req");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stored, 0);
  EXPECT_EQ(again->present, 3);
  EXPECT_EQ(again->failed, 0);
  EXPECT_EQ(again->keys_in_cache, std::vector<BlockKey>(c.keys.begin(), c.keys.begin() + 3));

  absl::StatusOr<SaveResult> longer = client->Save(ns, "t", Layout(), c.blocks, "req");
  ASSERT_TRUE(longer.ok()) << longer.status();
  EXPECT_EQ(longer->stored, 2);
  EXPECT_EQ(longer->present, 3);
  EXPECT_EQ(longer->keys_in_cache, c.keys);
  ExpectPayloads(FetchChain(*client, ns, c), c, 5);
  EXPECT_EQ(ActiveLeases(), 0u);
}

TEST_F(CacheClientTest, MalformedSavesAreRefusedBeforeAnyRpc) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("malformed");
  Chain c = MakeChain(ns, 3, 5);
  std::vector<BlockToSave> lying = c.blocks;
  lying[1].tokens[0] ^= 1;  // the key no longer names the tokens
  EXPECT_TRUE(absl::IsInvalidArgument(client->Save(ns, "t", Layout(), lying, "r").status()));
  std::vector<BlockToSave> broken = {c.blocks[0], c.blocks[2]};  // not a chain
  EXPECT_TRUE(absl::IsInvalidArgument(client->Save(ns, "t", Layout(), broken, "r").status()));
  std::vector<BlockToSave> short_payload = Prefix(c, 1);
  short_payload[0].payload = short_payload[0].payload.first(short_payload[0].payload.size() - 1);
  EXPECT_TRUE(
      absl::IsInvalidArgument(client->Save(ns, "t", Layout(), short_payload, "r").status()));
  EXPECT_EQ(FetchChain(*client, ns, c).hit_blocks, 0);
}

// Stores `bytes` under `key` straight through the store, as a buggy or hostile writer could.
void PutRaw(cache::BlockStore& store, const Namespace& ns, const BlockKey& key,
            const BlockKey& parent, const std::vector<uint8_t>& bytes) {
  v1::ReserveRequest req;
  req.set_namespace_id(std::string(ns.View()));
  req.set_tenant("t");
  auto* b = req.add_blocks();
  b->set_key(std::string(key.View()));
  b->set_parent_key(std::string(parent.View()));
  b->set_payload_bytes(bytes.size());
  v1::ReserveResponse resp;
  ASSERT_TRUE(store.Reserve(req, &resp).ok());
  ASSERT_EQ(resp.slots(0).status().code(), 0);
  std::memcpy(store.dram().base() + resp.slots(0).location().offset(), bytes.data(), bytes.size());
  v1::CommitRequest commit;
  commit.set_lease_id(resp.lease().lease_id());
  auto* cb = commit.add_blocks();
  cb->set_key(std::string(key.View()));
  cb->set_checksum(Checksum64(bytes.data(), bytes.size()));
  v1::CommitResponse cresp;
  ASSERT_TRUE(store.Commit(commit, &cresp).ok());
  ASSERT_EQ(cresp.results(0).code(), 0);
}

TEST_F(CacheClientTest, AForeignBlockEndsThePrefixAsAnIdentityMismatch) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("foreign");
  const Chain c = MakeChain(ns, 3, 6);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), Prefix(c, 1), "req").ok());
  // Block 1 is stored under its right key but carries other tokens (a collision or a forgery).
  std::vector<uint32_t> other_tokens = c.blocks[1].tokens;
  other_tokens[3] += 1;
  absl::StatusOr<std::vector<uint8_t>> foreign =
      EncodeBlock(Layout(), c.keys[1], c.keys[0], ns, other_tokens, c.blocks[1].payload);
  ASSERT_TRUE(foreign.ok());
  PutRaw(server_->store(), ns, c.keys[1], c.keys[0], *foreign);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), {c.blocks[2]}, "req").ok());

  const FetchResult r = FetchChain(*client, ns, c);
  EXPECT_EQ(r.hit_blocks, 3);
  ExpectPayloads(r, c, 1);
  EXPECT_TRUE(absl::IsNotFound(r.first_failure)) << r.first_failure;
  EXPECT_TRUE(IsBlockIdentityMismatch(r.first_failure));
  EXPECT_EQ(ActiveLeases(), 0u);

  // A block whose stored bytes are not a block at all ends the prefix as DataLoss.
  const Chain d = MakeChain(ns, 1, 7);
  std::vector<uint8_t> garbage(Layout().TotalBytes(), 0x5a);
  PutRaw(server_->store(), ns, d.keys[0], BlockKey{}, garbage);
  const FetchResult g = FetchChain(*client, ns, d);
  EXPECT_EQ(g.hit_blocks, 1);
  EXPECT_TRUE(g.blocks.empty());
  EXPECT_TRUE(absl::IsDataLoss(g.first_failure)) << g.first_failure;
}

// Every (first, count) on_blocks was called with, and whether its spans are the result's.
struct Runs {
  std::vector<std::pair<size_t, size_t>> seen;
  std::vector<const uint8_t*> payloads;  // in the order handed over
  size_t stop_after = SIZE_MAX;          // runs to accept before returning false

  FetchedBlocksFn Fn() {
    return [this](size_t first, std::span<const FetchedBlock> blocks) {
      seen.emplace_back(first, blocks.size());
      for (const FetchedBlock& b : blocks) payloads.push_back(b.payload.data());
      return seen.size() < stop_after;
    };
  }
  void ExpectCover(const FetchResult& r) const {
    ASSERT_EQ(payloads.size(), r.blocks.size());
    for (size_t i = 0; i < r.blocks.size(); ++i) EXPECT_EQ(payloads[i], r.blocks[i].payload.data());
  }
};

TEST_F(CacheClientTest, FetchHandsOverRunsOfBlocksInOrder) {
  const uint64_t block = Layout().TotalBytes();
  for (const TransportKind kind : {TransportKind::kTcp, TransportKind::kShm}) {
    SCOPED_TRACE(std::string(transfer::TransportKindName(kind)));
    auto client = Connect(Options(kind));
    ASSERT_NE(client, nullptr);
    const Namespace ns = Ns(std::string("runs-") + std::string(transfer::TransportKindName(kind)));
    const Chain c = MakeChain(ns, 10, 41);
    ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());

    // Runs of three blocks (a run size that is not a multiple of the block rounds down).
    Runs threes;
    const FetchResult r =
        client->Fetch(ns, c.keys, c.tokens, Layout(), "req",
                      {.on_blocks = threes.Fn(), .run_bytes = 3 * block + 100, .read_ahead = true});
    EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
    ExpectPayloads(r, c, 10);
    EXPECT_EQ(threes.seen,
              (std::vector<std::pair<size_t, size_t>>{{0, 3}, {3, 3}, {6, 3}, {9, 1}}));
    threes.ExpectCover(r);

    // A run size below one block reads block by block (here one run after the other); the
    // default is one run here.
    Runs ones, whole;
    ExpectPayloads(client->Fetch(ns, c.keys, c.tokens, Layout(), "req",
                                 {.on_blocks = ones.Fn(), .run_bytes = 1, .read_ahead = false}),
                   c, 10);
    EXPECT_EQ(ones.seen.size(), 10u);
    ExpectPayloads(client->Fetch(ns, c.keys, c.tokens, Layout(), "req", {.on_blocks = whole.Fn()}),
                   c, 10);
    EXPECT_EQ(whole.seen, (std::vector<std::pair<size_t, size_t>>{{0, 10}}));
    EXPECT_EQ(ActiveLeases(), 0u);
  }
}

// strata_cache_client_in_place_blocks_total (registering an existing family again returns it).
double InPlaceBlocks() {
  return MetricsRegistry::Default()
      .AddCounter("strata_cache_client_in_place_blocks_total", "", {})
      .Labels({})
      .Value();
}

TEST_F(CacheClientTest, FetchReadsInPlaceFromAMappedServer) {
  for (const TransportKind kind : {TransportKind::kShm, TransportKind::kTcp}) {
    for (const bool take : {true, false}) {
      SCOPED_TRACE(std::string(transfer::TransportKindName(kind)) + (take ? "" : ", declined"));
      auto client = Connect(Options(kind));
      ASSERT_NE(client, nullptr);
      const Namespace ns =
          Ns(std::string("inplace-") + std::string(transfer::TransportKindName(kind)));
      const Chain c = MakeChain(ns, 7, 53);
      ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());

      InPlace in_place{.take = take};
      const double in_place0 = InPlaceBlocks();
      int buffers = 0;
      bool all_in_region = true, all_equal = true;
      Runs runs;
      FetchedBlocksFn record = runs.Fn();
      const FetchResult r = client->Fetch(
          ns, c.keys, c.tokens, Layout(), "req",
          {.buffer = [&](size_t bytes) -> absl::StatusOr<std::shared_ptr<HostBuffer>> {
             ++buffers;
             return HostBuffer::Allocate(bytes);
           },
           .on_blocks =
               [&](size_t first, std::span<const FetchedBlock> blocks) {
                 for (size_t i = 0; i < blocks.size(); ++i) {
                   all_in_region &= in_place.Holds(blocks[i].payload);
                   all_equal &= std::ranges::equal(blocks[i].payload, c.blocks[first + i].payload);
                 }
                 return record(first, blocks);
               },
           .in_place = in_place.Fn(),
           .run_bytes = 3 * Layout().TotalBytes(),
           .read_ahead = true});
      EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
      EXPECT_EQ(r.blocks.size(), 7u);
      EXPECT_TRUE(all_equal);
      EXPECT_EQ(runs.seen.size(), 3u);
      const bool mapped = kind == TransportKind::kShm && take;
      EXPECT_EQ(in_place.asked, kind == TransportKind::kShm ? 1 : 0);
      EXPECT_EQ(all_in_region, mapped);
      EXPECT_EQ(r.mapping != nullptr, mapped);
      EXPECT_EQ(r.buffer != nullptr, !mapped);
      EXPECT_EQ(buffers, mapped ? 0 : 1);
      EXPECT_EQ(InPlaceBlocks() - in_place0, mapped ? 7 : 0);
      EXPECT_EQ(ActiveLeases(), 0u);
    }
  }
}

TEST_F(CacheClientTest, ACallerThatStopsTheFetchGetsNoMoreBlocks) {
  auto client = Connect(Options(TransportKind::kShm));
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("stop");
  const Chain c = MakeChain(ns, 8, 43);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());
  Runs runs;
  runs.stop_after = 2;
  const FetchResult r = client->Fetch(
      ns, c.keys, c.tokens, Layout(), "req",
      {.on_blocks = runs.Fn(), .run_bytes = 2 * Layout().TotalBytes(), .read_ahead = true});
  EXPECT_EQ(r.hit_blocks, 8);
  EXPECT_TRUE(absl::IsCancelled(r.first_failure)) << r.first_failure;
  ExpectPayloads(r, c, 4);
  EXPECT_EQ(runs.seen, (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 2}}));
  runs.ExpectCover(r);
  EXPECT_EQ(ActiveLeases(), 0u);
}

TEST_F(CacheClientTest, ABadBlockInALaterRunEndsThePrefixThere) {
  auto client = Connect(Options(TransportKind::kShm));
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("bad-run");
  const Chain c = MakeChain(ns, 8, 47);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), Prefix(c, 5), "req").ok());
  std::vector<uint8_t> garbage(Layout().TotalBytes(), 0x5a);  // block 5: not a block at all
  PutRaw(server_->store(), ns, c.keys[5], c.keys[4], garbage);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), {c.blocks[6], c.blocks[7]}, "req").ok());

  for (const bool mapped : {false, true}) {
    SCOPED_TRACE(mapped ? "in place" : "copied");
    Runs runs;
    InPlace in_place;
    const FetchResult r = client->Fetch(ns, c.keys, c.tokens, Layout(), "req",
                                        {.on_blocks = runs.Fn(),
                                         .in_place = mapped ? in_place.Fn() : InPlaceFn(),
                                         .run_bytes = 2 * Layout().TotalBytes(),
                                         .read_ahead = true});
    EXPECT_EQ(r.mapping != nullptr, mapped);
    EXPECT_EQ(r.hit_blocks, 8);
    EXPECT_TRUE(absl::IsDataLoss(r.first_failure)) << r.first_failure;
    EXPECT_NE(r.first_failure.message().find("block 5"), std::string::npos) << r.first_failure;
    // The run holding block 5 is handed over up to it; nothing after it is handed over.
    EXPECT_EQ(runs.seen, (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 2}, {4, 1}}));
    runs.ExpectCover(r);
    if (!mapped) ExpectPayloads(r, c, 5);  // in place, the payloads were valid in on_blocks only
    EXPECT_EQ(ActiveLeases(), 0u);
  }
}

TEST_F(CacheClientTest, CorruptReadsAreCaughtAndTheServerStillServesOthers) {
  auto clean = Connect(Options());
  ASSERT_NE(clean, nullptr);
  const Namespace ns = Ns("corrupt");
  const Chain c = MakeChain(ns, 3, 8);
  ASSERT_TRUE(clean->Save(ns, "t", Layout(), c.blocks, "req").ok());

  auto counters = std::make_shared<transfer::FaultCounters>();
  CacheClientOptions o = Options();
  o.client_id = "faulty";
  o.wrap_transport = [counters](std::unique_ptr<transfer::Transport> t) {
    return std::make_unique<transfer::FaultInjectingTransport>(
        std::move(t), transfer::FaultPolicy{.corrupt = 1.0}, counters);
  };
  auto faulty = Connect(std::move(o));
  ASSERT_NE(faulty, nullptr);
  const FetchResult bad = FetchChain(*faulty, ns, c);
  EXPECT_EQ(bad.hit_blocks, 3);
  EXPECT_TRUE(bad.blocks.empty());
  EXPECT_TRUE(absl::IsDataLoss(bad.first_failure)) << bad.first_failure;
  EXPECT_GT(counters->corrupted.load(), 0);
  EXPECT_EQ(ActiveLeases(), 0u);

  // Corrupt writes do not get committed either.
  const Chain w = MakeChain(ns, 2, 9);
  absl::StatusOr<SaveResult> saved = faulty->Save(ns, "t", Layout(), w.blocks, "req");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->stored, 0);
  EXPECT_EQ(saved->failed, 2);
  EXPECT_TRUE(absl::IsDataLoss(saved->first_error)) << saved->first_error;
  EXPECT_EQ(FetchChain(*clean, ns, w).hit_blocks, 0);

  ExpectPayloads(FetchChain(*clean, ns, c), c, 3);
}

double CounterValue(const std::string& name, const std::vector<std::string>& label_names,
                    const std::vector<std::string>& values) {
  // Registering an existing family again returns it.
  return MetricsRegistry::Default().AddCounter(name, "", label_names).Labels(values).Value();
}

TEST_F(CacheClientTest, MetricsCountBlocksBytesAndFailures) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("metrics");
  const Chain c = MakeChain(ns, 3, 16);
  const double block = static_cast<double>(Layout().TotalBytes());
  auto stored = [] {
    return CounterValue("strata_cache_client_saved_blocks_total", {"outcome"}, {"stored"});
  };
  auto present = [] {
    return CounterValue("strata_cache_client_saved_blocks_total", {"outcome"}, {"present"});
  };
  auto fetched = [] {
    return CounterValue("strata_cache_client_fetched_blocks_total", {"tier"}, {"dram"});
  };
  auto bytes = [](const std::string& direction) {
    return CounterValue("strata_cache_client_bytes_total", {"direction", "transport"},
                        {direction, "tcp"});
  };
  auto data_loss = [] {
    return CounterValue("strata_cache_client_fetch_failures_total", {"reason"}, {"data_loss"});
  };
  const double stored0 = stored(), present0 = present(), fetched0 = fetched();
  const double written0 = bytes("write"), read0 = bytes("read"), loss0 = data_loss();

  ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());
  ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());
  ASSERT_EQ(FetchChain(*client, ns, c).blocks.size(), 3u);
  EXPECT_EQ(stored() - stored0, 3);
  EXPECT_EQ(present() - present0, 3);
  EXPECT_EQ(fetched() - fetched0, 3);
  EXPECT_EQ(bytes("write") - written0, 3 * block);
  EXPECT_EQ(bytes("read") - read0, 3 * block);

  CacheClientOptions o = Options();
  o.wrap_transport = [](std::unique_ptr<transfer::Transport> t) {
    return std::make_unique<transfer::FaultInjectingTransport>(
        std::move(t), transfer::FaultPolicy{.corrupt = 1.0});
  };
  auto faulty = Connect(std::move(o));
  ASSERT_NE(faulty, nullptr);
  EXPECT_TRUE(absl::IsDataLoss(FetchChain(*faulty, ns, c).first_failure));
  EXPECT_EQ(data_loss() - loss0, 1);
  const std::string text = MetricsRegistry::Default().RenderPrometheus();
  EXPECT_NE(text.find("strata_cache_client_fetched_blocks_total{tier=\"dram\"}"),
            std::string::npos);
}

TEST_F(CacheClientTest, ReadsThatNeverCompleteEndAtTheTransferTimeout) {
  auto clean = Connect(Options());
  ASSERT_NE(clean, nullptr);
  const Namespace ns = Ns("drop");
  const Chain c = MakeChain(ns, 2, 14);
  ASSERT_TRUE(clean->Save(ns, "t", Layout(), c.blocks, "req").ok());
  CacheClientOptions o = Options();
  o.transfer_timeout = absl::Milliseconds(500);
  o.wrap_transport = [](std::unique_ptr<transfer::Transport> t) {
    return std::make_unique<transfer::FaultInjectingTransport>(std::move(t),
                                                               transfer::FaultPolicy{.drop = 1.0});
  };
  auto dropping = Connect(std::move(o));
  ASSERT_NE(dropping, nullptr);
  const FetchResult r = FetchChain(*dropping, ns, c);
  EXPECT_EQ(r.hit_blocks, 2);
  EXPECT_TRUE(r.blocks.empty());
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.first_failure)) << r.first_failure;
  EXPECT_EQ(ActiveLeases(), 0u);
}

}  // namespace
}  // namespace strata::cache_client::testing_util
