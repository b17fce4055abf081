// CacheClient::Fetch: lookup under a read lease, reads in runs (copied or in place), checks,
// hand-over to the caller (cache_client.h).
#include <algorithm>
#include <chrono>
#include <future>
#include <system_error>
#include <thread>
#include <utility>

#include "common/block_format.h"
#include "common/parallel_copy.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/cache_client/cache_client.h"
#include "compute_nodes/cache_client/client_impl.h"
#include "spdlog/spdlog.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::cache_client {
namespace {

using internal::BlockOp;
using internal::DataPath;
using internal::KeyBytes;
using internal::RunBatch;

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string_view TierLabel(HitTier tier) {
  switch (tier) {
    case HitTier::kGpu:
      return "gpu";
    case HitTier::kDram:
      return "dram";
    case HitTier::kSsd:
      return "ssd";
  }
  return "dram";
}

HitTier FromProtoTier(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_GPU:
      return HitTier::kGpu;
    case v1::TIER_SSD:
      return HitTier::kSsd;
    default:
      return HitTier::kDram;
  }
}

// The metrics label of a fetch failure. `identity`: the block was intact but not the one asked.
std::string_view FailureReason(const absl::Status& status, bool identity) {
  if (identity) return "identity";
  switch (status.code()) {
    case absl::StatusCode::kDataLoss:
      return "data_loss";
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
      return "unavailable";
    case absl::StatusCode::kDeadlineExceeded:
      return "deadline";
    default:
      return "other";
  }
}

bool SameLayout(const BlockLayout& a, const BlockLayout& b) {
  return a.codec == b.codec && a.n_layers == b.n_layers && a.block_tokens == b.block_tokens &&
         a.kv_lora_rank == b.kv_lora_rank && a.rope_dim == b.rope_dim;
}

// One fetched block, parsed and checked against the key and tokens asked for.
struct CheckedBlock {
  absl::Status status;    // the message starts with ": " or " was ..." (after the key)
  bool identity = false;  // an intact block that is not the one asked for
  std::span<const uint8_t> payload;
};

CheckedBlock CheckBlock(std::span<const uint8_t> bytes, const BlockLayout& layout,
                        const BlockKey& key, std::span<const uint32_t> expected_tokens) {
  absl::StatusOr<BlockView> view = ParseBlock(bytes);
  if (!view.ok()) {
    return {absl::Status(view.status().code(), StrCat(": ", view.status().message())),
            IsBlockIdentityMismatch(view.status())};
  }
  if (!SameLayout(view->header.layout, layout)) {
    return {absl::NotFoundError(" was stored with another layout"), true};
  }
  // The bytes are what the server holds: the engine checked the read against the checksum the
  // server verified at commit. So only the identity is checked here, not the payload's hash.
  if (absl::Status v =
          VerifyBlockIdentity(view->header, view->tokens, view->payload, key, expected_tokens);
      !v.ok()) {
    return {absl::Status(v.code(), StrCat(": ", v.message())), IsBlockIdentityMismatch(v)};
  }
  return {absl::OkStatus(), false, view->payload};
}

// What the reads of one run gave: per block, OK and where its bytes are, or why not.
struct RunRead {
  std::vector<absl::Status> status;
  std::vector<std::span<const uint8_t>> bytes;  // for the blocks read, in order
  std::shared_ptr<const void> owner;            // in place: the mapping the bytes lie in
};

}  // namespace

FetchResult CacheClient::Fetch(const Namespace& ns, std::span<const BlockKey> keys,
                               std::span<const uint32_t> tokens, const BlockLayout& layout,
                               const std::string& request_id, const FetchOptions& options) {
  Impl& im = *impl_;
  FetchResult out;
  bool identity = false;
  // Ends the verified prefix (once: the first failure is the one reported).
  auto fail = [&](absl::Status status, bool is_identity = false) {
    if (!out.first_failure.ok()) return;
    out.first_failure = std::move(status);
    identity = is_identity;
  };
  if (keys.empty()) return out;
  if (const absl::Status v = ValidateBlockLayout(layout); !v.ok()) {
    fail(v);
  } else if (tokens.size() != keys.size() * layout.block_tokens) {
    fail(absl::InvalidArgumentError(StrCat("fetch of ", keys.size(), " blocks with ", tokens.size(),
                                           " tokens; want ", keys.size() * layout.block_tokens)));
  }
  if (!out.first_failure.ok()) {
    im.metrics.fetch_failures.Labels({"other"}).Increment();
    return out;
  }

  // 1. Lookup: the longest present prefix, under a read lease, promoted to DRAM.
  const Clock::time_point lookup_start = Clock::now();
  v1::LookupRequest lreq;
  lreq.set_client_id(im.options.client_id);
  lreq.set_namespace_id(std::string(ns.View()));
  for (const BlockKey& k : keys) lreq.add_keys(KeyBytes(k));
  lreq.set_lease(true);
  lreq.set_promote(true);
  lreq.set_request_id(request_id);
  v1::LookupResponse lresp;
  {
    grpc::ClientContext ctx;
    im.SetDeadline(ctx);
    const grpc::Status s = im.stub->Lookup(&ctx, lreq, &lresp);
    out.lookup_ms = MsSince(lookup_start);
    if (!s.ok()) {
      fail(im.RpcError(s, "Lookup"));
      im.metrics.fetch_failures.Labels({std::string(FailureReason(out.first_failure, false))})
          .Increment();
      return out;
    }
  }
  const uint64_t lease_id = lresp.has_lease() ? lresp.lease().lease_id() : 0;
  out.hit_blocks = std::min<int64_t>({int64_t{lresp.hit_blocks()}, int64_t{lresp.locations_size()},
                                      static_cast<int64_t>(keys.size())});

  // 2. Which hits can be read remotely: a prefix of them.
  const uint64_t block_bytes = layout.TotalBytes();
  // A block that cannot be read ends the prefix, but reads before it may fail first: the
  // reason is kept aside until they are verified.
  absl::Status unreadable;
  bool unreadable_identity = false;
  auto stop_at = [&](absl::Status status, bool is_identity = false) {
    unreadable = std::move(status);
    unreadable_identity = is_identity;
  };
  size_t readable = 0;
  for (; readable < static_cast<size_t>(out.hit_blocks); ++readable) {
    const v1::BlockLocation& loc = lresp.locations(static_cast<int>(readable));
    if (loc.key() != KeyBytes(keys[readable])) {
      stop_at(
          absl::InternalError(StrCat("Lookup answered location ", readable, " for another key")));
      break;
    }
    if (loc.capability().empty()) {
      stop_at(
          absl::UnavailableError(StrCat("block ", readable, " (", keys[readable].Hex(), ", ",
                                        v1::Tier_Name(loc.tier()), ") is not remotely readable")));
      break;
    }
    if (loc.length() != block_bytes) {
      stop_at(absl::NotFoundError(StrCat("block ", readable, " (", keys[readable].Hex(), ") is ",
                                         loc.length(), " bytes; the layout makes ", block_bytes)),
              /*is_identity=*/true);
      break;
    }
  }

  // 3. The reads, in runs of about options.run_bytes, each read checked against the stored
  // checksum: in place when the data path maps the server's memory and the caller takes blocks
  // from there (FetchOptions::in_place), else copied into one buffer. Run k + 1 is read on a
  // helper thread while run k is checked (on up to 8 threads: each check parses megabytes) and
  // handed to on_blocks, in order; the first block that fails ends the prefix, and no later run
  // is handed over.
  if (readable > 0) {
    std::shared_ptr<const DataPath> path = im.Path();
    const Clock::time_point transfer_start = Clock::now();
    const size_t run_blocks =
        static_cast<size_t>(std::clamp<uint64_t>(options.run_bytes / block_bytes, 1, readable));
    auto op_of = [&lresp, block_bytes](size_t i, uint8_t* local) {
      const v1::BlockLocation& loc = lresp.locations(static_cast<int>(i));
      return BlockOp(transfer::OpKind::kRead, local, loc, block_bytes, loc.checksum());
    };
    // In place or not, decided per data path: a probe of one byte finds the mapped region.
    bool in_place = false;
    auto decide = [&] {
      in_place = false;
      if (!options.in_place) return;
      transfer::TransferOp probe = op_of(0, nullptr);
      probe.length = 1;
      probe.checksum.reset();
      absl::StatusOr<transfer::MappedBytes> m =
          std::move(im.engine->MapReads(*path->peer, {&probe, 1}, im.options.transfer_timeout)[0]);
      in_place = m.ok() && options.in_place(m->region, m->owner);
    };
    std::shared_ptr<HostBuffer> buffer;  // copies only
    auto ensure_buffer = [&] {
      if (buffer != nullptr) return;
      const size_t bytes = readable * block_bytes;
      if (options.buffer) {
        absl::StatusOr<std::shared_ptr<HostBuffer>> given = options.buffer(bytes);
        if (given.ok() && *given != nullptr && (*given)->size() >= bytes) {
          buffer = *std::move(given);
        } else {
          spdlog::warn(
              "cache client: fetch {}: no {}-byte fetch buffer ({}); reading to heap memory",
              request_id, bytes,
              given.ok() ? std::string("too small") : ToStd(given.status().message()));
        }
      }
      if (buffer == nullptr) buffer = HostBuffer::Allocate(bytes);
      out.buffer = buffer;
    };
    // Reads blocks [begin, end) through `p`.
    auto read_run = [&](const DataPath& p, bool mapped, size_t begin, size_t end) {
      RunRead run;
      std::vector<transfer::TransferOp> reads;
      reads.reserve(end - begin);
      for (size_t i = begin; i < end; ++i) {
        reads.push_back(op_of(i, mapped ? nullptr : buffer->data() + i * block_bytes));
      }
      if (mapped) {
        for (auto& m : im.engine->MapReads(*p.peer, reads, im.options.transfer_timeout)) {
          run.status.push_back(m.status());
          if (!m.ok()) continue;
          run.bytes.push_back(m->bytes);
          run.owner = m->owner;
        }
        return run;
      }
      std::shared_ptr<transfer::Batch> batch =
          RunBatch(*im.engine, *p.peer, std::move(reads), im.options.transfer_timeout, buffer);
      for (size_t i = begin; i < end; ++i) {
        absl::Status st = batch->status(i - begin);
        if (absl::IsUnavailable(st) && st.message() == "pending") {
          st = absl::DeadlineExceededError("read did not complete in time");
        }
        run.status.push_back(std::move(st));
        run.bytes.emplace_back(buffer->data() + i * block_bytes, block_bytes);
      }
      return run;
    };
    auto start_run = [&](size_t begin, size_t end) {
      decide();
      if (!in_place) ensure_buffer();
      return read_run(*path, in_place, begin, end);
    };
    size_t begin = 0, end = run_blocks;
    RunRead run = start_run(begin, end);
    if (const absl::Status& first = run.status[0];
        absl::IsUnavailable(first) || absl::IsDataLoss(first)) {
      // The server answered the Lookup but its data path is gone: it restarted (new transfer
      // ports, a new shm arena). Over tcp that is a refused connection; over shm the old arena
      // stays mapped and readable, so it shows as bytes that fail their checksum. Re-open the
      // path once and read again under the same lease (real corruption fails again).
      im.MaybeStale(first);
      std::shared_ptr<const DataPath> fresh = im.Path(/*now=*/true);
      if (fresh != path) {
        path = std::move(fresh);
        run = start_run(begin, end);
      }
    }
    if (in_place) out.mapping = run.owner;

    // 4. Each run as it arrives: check its blocks, take them in order, hand them over.
    uint64_t bytes_read = 0;
    // The overlap needs cores to spare: the reads and checks take up to 8 threads each, and the
    // caller's import more. On a host of 2 or 3 the next run is read after this one by default.
    static const bool many_cores = std::thread::hardware_concurrency() >= 4;
    const bool overlap = options.read_ahead.value_or(many_cores);
    while (true) {
      const size_t next_end = std::min(readable, end + run_blocks);
      std::future<RunRead> next;
      if (end < readable && overlap) {
        try {
          next = std::async(std::launch::async, [&read_run, path, in_place, end, next_end] {
            return read_run(*path, in_place, end, next_end);
          });
        } catch (const std::system_error& e) {  // no thread to be had: read it after this run
          spdlog::debug("cache client: fetch {}: reading the next run inline: {}", request_id,
                        e.what());
        }
      }
      size_t arrived = begin;
      while (arrived < end && run.status[arrived - begin].ok()) ++arrived;
      std::vector<CheckedBlock> checked(arrived - begin);
      ForEachCopy(static_cast<int64_t>(checked.size()),
                  static_cast<int64_t>(checked.size() * block_bytes), [&](int64_t j) {
                    const size_t i = begin + static_cast<size_t>(j);
                    checked[j] =
                        CheckBlock(run.bytes[j], layout, keys[i],
                                   tokens.subspan(i * layout.block_tokens, layout.block_tokens));
                  });
      bool whole = true;  // every block of the run checked out
      for (size_t i = begin; i < end; ++i) {
        if (i == arrived) {
          const absl::Status& st = run.status[i - begin];
          im.MaybeStale(st);
          fail(absl::Status(st.code(), StrCat("reading block ", i, " (", keys[i].Hex(), ") from ",
                                              im.options.address, ": ", st.message())));
          whole = false;
          break;
        }
        bytes_read += block_bytes;
        if (const CheckedBlock& c = checked[i - begin]; !c.status.ok()) {
          fail(absl::Status(c.status.code(),
                            StrCat("block ", i, " (", keys[i].Hex(), ")", c.status.message())),
               c.identity);
          whole = false;
          break;
        }
        // Count an SSD hit as SSD even though Lookup(promote) served it from DRAM.
        const v1::BlockLocation& loc = lresp.locations(static_cast<int>(i));
        const HitTier tier =
            FromProtoTier(loc.found_in() != v1::TIER_UNSPECIFIED ? loc.found_in() : loc.tier());
        out.blocks.push_back({.tier = tier, .payload = checked[i - begin].payload});
        im.metrics.fetched.Labels({std::string(TierLabel(tier))}).Increment();
        if (in_place) im.metrics.in_place.Increment();
      }
      // The checked part of the run (all of it unless a block failed) goes to the caller.
      if (out.blocks.size() > begin && options.on_blocks &&
          !options.on_blocks(begin, std::span<const FetchedBlock>(out.blocks).subspan(begin)) &&
          whole) {
        fail(absl::CancelledError(StrCat("the caller stopped the fetch after ", end, " blocks")));
        whole = false;
      }
      if (next.valid()) {
        RunRead read = next.get();  // wait for it either way
        if (whole) run = std::move(read);
      } else if (whole && end < readable) {
        run = read_run(*path, in_place, end, next_end);
      }
      if (!whole || end == readable) break;
      begin = end;
      end = next_end;
    }
    out.transfer_ms = MsSince(transfer_start);
    im.metrics.bytes.Labels({"read", path->label}).Increment(static_cast<double>(bytes_read));
  }

  if (out.blocks.size() == readable && !unreadable.ok()) fail(unreadable, unreadable_identity);

  // 5. The read lease ends here, whatever happened (best effort; it expires otherwise).
  if (lease_id != 0) im.ReleaseLease(lease_id);
  if (!out.first_failure.ok()) {
    im.metrics.fetch_failures.Labels({std::string(FailureReason(out.first_failure, identity))})
        .Increment();
    spdlog::debug("cache client: fetch {}: {} of {} hit blocks verified: {}", request_id,
                  out.blocks.size(), out.hit_blocks, ToStd(out.first_failure.message()));
  }
  return out;
}

}  // namespace strata::cache_client
