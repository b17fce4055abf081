#include "compute_nodes/cache_client/cache_client.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/host.h"
#include "common/metrics.h"
#include "common/parallel_copy.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/cache_client/client_impl.h"
#include "compute_nodes/cache_client/save_queue.h"
#include "spdlog/spdlog.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::cache_client {
namespace {

using internal::BlockOp;
using internal::DataPath;
using internal::KeyBytes;
using internal::RunBatch;

absl::Status ItemToStatus(const v1::ItemStatus& item) {
  return absl::Status(static_cast<absl::StatusCode>(item.code()), item.message());
}

bool IsZero(const BlockKey& key) {
  return std::all_of(key.bytes.begin(), key.bytes.end(), [](uint8_t b) { return b == 0; });
}

}  // namespace

CacheClient::CacheClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CacheClient::~CacheClient() {
  // Pending saves still use the channel and the engine: drain them first.
  std::unique_ptr<SaveQueue> queue;
  {
    std::lock_guard<std::mutex> lock(impl_->queue_mu);
    queue = std::move(impl_->queue);
  }
  queue.reset();
}

const std::string& CacheClient::address() const { return impl_->options.address; }
const std::string& CacheClient::server_id() const { return impl_->server_id; }
transfer::TransportKind CacheClient::transport() const {
  std::lock_guard<std::mutex> lock(impl_->path_mu);
  return impl_->path->peer->transport();
}

uint64_t CacheClient::pending_save_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->queue_mu);
  return impl_->queue ? impl_->queue->pending_bytes() : 0;
}

absl::StatusOr<std::unique_ptr<CacheClient>> CacheClient::Connect(CacheClientOptions options) {
  if (options.address.empty()) return absl::InvalidArgumentError("cache client: empty address");
  if (options.host_id.empty()) options.host_id = HostName();
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  const CacheClientOptions& o = impl->options;

  transfer::EngineOptions eo;
  if (o.transfer) {
    eo = *o.transfer;
  } else {
    eo.enable_rdma = true;
    eo.connect_timeout = o.rpc_timeout;
  }
  eo.host_id = o.host_id;
  eo.secret = transfer::ClusterSecret(o.cluster_secret);
  if (o.force_transport) eo.force_transport = o.force_transport;
  eo.wrap_transport = o.wrap_transport;
  ASSIGN_OR_RETURN(impl->engine, transfer::TransferEngine::Create(std::move(eo)));

  // A restarted server is found again within a few seconds (gRPC's default backoff grows to
  // two minutes, during which every call would fail fast).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  impl->channel = grpc::CreateCustomChannel(o.address, grpc::InsecureChannelCredentials(), args);
  impl->stub = v1::CacheControl::NewStub(impl->channel);
  ASSIGN_OR_RETURN(std::shared_ptr<const DataPath> path, impl->OpenDataPath(&impl->server_id));
  spdlog::info("cache client {}: connected to {} ({}) over {}", o.client_id, o.address,
               impl->server_id, path->label);
  {
    std::lock_guard<std::mutex> lock(impl->path_mu);
    impl->path = std::move(path);
    impl->path_opened = absl::Now();
  }
  return std::unique_ptr<CacheClient>(new CacheClient(std::move(impl)));
}

absl::StatusOr<SaveResult> CacheClient::Save(const Namespace& ns, const std::string& tenant,
                                             const BlockLayout& layout,
                                             std::vector<BlockToSave> blocks,
                                             const std::string& request_id) {
  Impl& im = *impl_;
  SaveResult out;
  if (blocks.empty()) return out;
  RETURN_IF_ERROR(ValidateBlockLayout(layout));

  // 1. Encode every block; a block whose key does not name its tokens is a caller bug, and
  //    publishing it would poison the cache for everyone sharing the namespace.
  //    Blocks are encoded on up to 8 threads (each a copy and two checksum passes over
  //    megabytes); the first bad one, in order, is the error.
  const uint64_t block_bytes = layout.TotalBytes();
  auto encoded = std::make_shared<std::vector<uint8_t>>(blocks.size() * block_bytes);
  std::vector<uint64_t> checksums(blocks.size());
  std::vector<absl::Status> bad(blocks.size());
  ForEachCopy(static_cast<int64_t>(blocks.size()),
              static_cast<int64_t>(blocks.size() * block_bytes), [&](int64_t i) {
                const BlockToSave& b = blocks[i];
                if (i > 0 && b.parent != blocks[i - 1].key) {
                  bad[i] = absl::InvalidArgumentError(
                      StrCat("save: block ", i, " does not continue the chain of block ", i - 1));
                  return;
                }
                if (b.tokens.size() == layout.block_tokens &&
                    ChainBlockKey(ns, b.parent, b.tokens) != b.key) {
                  bad[i] = absl::InvalidArgumentError(
                      StrCat("save: block ", i, " key ", b.key.Hex(), " does not name its tokens"));
                  return;
                }
                absl::StatusOr<std::vector<uint8_t>> bytes =
                    EncodeBlock(layout, b.key, b.parent, ns, b.tokens, b.payload);
                if (!bytes.ok()) {
                  bad[i] = Annotate(bytes.status(), StrCat("save: block ", i));
                  return;
                }
                std::memcpy(encoded->data() + i * block_bytes, bytes->data(), block_bytes);
                checksums[i] = Checksum64(bytes->data(), bytes->size());
              });
  for (const absl::Status& st : bad) RETURN_IF_ERROR(st);

  // 2. Reserve slots for all of them in one call.
  v1::ReserveRequest rreq;
  rreq.set_client_id(im.options.client_id);
  rreq.set_namespace_id(std::string(ns.View()));
  rreq.set_tenant(tenant);
  rreq.set_request_id(request_id);
  v1::KvFormat* format = rreq.mutable_format();
  format->set_codec(static_cast<v1::Codec>(layout.codec));
  format->set_block_tokens(layout.block_tokens);
  format->set_layout_version(kBlockFormatVersion);
  format->set_num_layers(layout.n_layers);
  format->set_kv_lora_rank(layout.kv_lora_rank);
  format->set_rope_dim(layout.rope_dim);
  for (const BlockToSave& b : blocks) {
    auto* spec = rreq.add_blocks();
    spec->set_key(KeyBytes(b.key));
    if (!IsZero(b.parent)) spec->set_parent_key(KeyBytes(b.parent));
    spec->set_payload_bytes(block_bytes);
  }
  v1::ReserveResponse rresp;
  {
    grpc::ClientContext ctx;
    im.SetDeadline(ctx);
    if (const grpc::Status s = im.stub->Reserve(&ctx, rreq, &rresp); !s.ok()) {
      return im.RpcError(s, "Reserve");
    }
  }
  if (rresp.slots_size() != static_cast<int>(blocks.size())) {
    return absl::InternalError(StrCat("cache server ", im.options.address, ": Reserve answered ",
                                      rresp.slots_size(), " slots for ", blocks.size(), " blocks"));
  }

  enum class Outcome { kPending, kStored, kPresent, kFailed };
  std::vector<Outcome> outcome(blocks.size(), Outcome::kPending);
  auto failed = [&](size_t i, const absl::Status& st) {
    outcome[i] = Outcome::kFailed;
    if (out.first_error.ok()) {
      out.first_error = absl::Status(
          st.code(), StrCat("block ", i, " (", blocks[i].key.Hex(), "): ", st.message()));
    }
  };
  std::vector<size_t> to_write;
  std::vector<transfer::TransferOp> writes;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& slot = rresp.slots(static_cast<int>(i));
    const absl::Status st = ItemToStatus(slot.status());
    if (absl::IsAlreadyExists(st)) {
      outcome[i] = Outcome::kPresent;
    } else if (!st.ok()) {
      failed(i, st);
    } else {
      to_write.push_back(i);
      writes.push_back(BlockOp(transfer::OpKind::kWrite, encoded->data() + i * block_bytes,
                               slot.location(), block_bytes, checksums[i]));
    }
  }

  // 3. Write the reserved slots in one batch, then commit what arrived.
  if (!to_write.empty()) {
    const std::shared_ptr<const DataPath> path = im.Path();
    auto batch =
        RunBatch(*im.engine, *path->peer, std::move(writes), im.options.transfer_timeout, encoded);
    v1::CommitRequest creq;
    creq.set_lease_id(rresp.lease().lease_id());
    std::vector<size_t> committed;
    for (size_t j = 0; j < to_write.size(); ++j) {
      absl::Status st = batch->status(j);
      if (absl::IsUnavailable(st) && st.message() == "pending") {
        st = absl::DeadlineExceededError("write did not complete in time");
      }
      if (!st.ok()) {
        im.MaybeStale(st);
        failed(to_write[j], st);
        continue;
      }
      auto* c = creq.add_blocks();
      c->set_key(KeyBytes(blocks[to_write[j]].key));
      c->set_checksum(checksums[to_write[j]]);
      committed.push_back(to_write[j]);
    }
    im.metrics.bytes.Labels({"write", path->label})
        .Increment(static_cast<double>(committed.size() * block_bytes));
    // Commit even when nothing arrived: it ends the write lease and frees the slots now.
    v1::CommitResponse cresp;
    grpc::ClientContext ctx;
    im.SetDeadline(ctx);
    if (const grpc::Status s = im.stub->Commit(&ctx, creq, &cresp); !s.ok()) {
      return im.RpcError(s, "Commit");
    }
    for (size_t j = 0; j < committed.size(); ++j) {
      const absl::Status st = static_cast<int>(j) < cresp.results_size()
                                  ? ItemToStatus(cresp.results(static_cast<int>(j)))
                                  : absl::InternalError("Commit answered no result");
      if (st.ok()) {
        outcome[committed[j]] = Outcome::kStored;
      } else {
        im.MaybeStale(st);  // DataLoss: the bytes went to an arena the server no longer uses?
        failed(committed[j], st);
      }
    }
  }

  for (size_t i = 0; i < blocks.size(); ++i) {
    switch (outcome[i]) {
      case Outcome::kStored:
        ++out.stored;
        out.keys_in_cache.push_back(blocks[i].key);
        break;
      case Outcome::kPresent:
        ++out.present;
        out.keys_in_cache.push_back(blocks[i].key);
        break;
      default:
        ++out.failed;
        break;
    }
  }
  if (out.stored > 0) im.metrics.saved.Labels({"stored"}).Increment(out.stored);
  if (out.present > 0) im.metrics.saved.Labels({"present"}).Increment(out.present);
  if (out.failed > 0) {
    im.metrics.saved.Labels({"failed"}).Increment(out.failed);
    spdlog::debug("cache client: save {}: {} stored, {} present, {} failed: {}", request_id,
                  out.stored, out.present, out.failed, ToStd(out.first_error.message()));
  }
  return out;
}

void CacheClient::SaveAsync(const Namespace& ns, const std::string& tenant,
                            const BlockLayout& layout, std::vector<BlockToSave> blocks,
                            const std::string& request_id,
                            std::function<void(absl::StatusOr<SaveResult>)> done) {
  uint64_t bytes = 0;
  for (const BlockToSave& b : blocks) bytes += b.payload.size() + 4 * b.tokens.size();
  SaveQueue* queue;
  {
    std::lock_guard<std::mutex> lock(impl_->queue_mu);
    if (!impl_->queue)
      impl_->queue = std::make_unique<SaveQueue>(impl_->options.max_pending_save_bytes);
    queue = impl_->queue.get();
  }
  // The queue lives until the destructor, which must not run concurrently with SaveAsync.
  queue->Push(bytes, [this, ns, tenant, layout, blocks = std::move(blocks), request_id,
                      done = std::move(done)]() mutable {
    absl::StatusOr<SaveResult> result = Save(ns, tenant, layout, std::move(blocks), request_id);
    if (done) done(std::move(result));
  });
}

void CacheClient::FlushSaves() {
  SaveQueue* queue;
  {
    std::lock_guard<std::mutex> lock(impl_->queue_mu);
    queue = impl_->queue.get();
  }
  if (queue != nullptr) queue->Flush();
}

}  // namespace strata::cache_client
