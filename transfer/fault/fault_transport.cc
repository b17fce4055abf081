#include "transfer/fault/fault_transport.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "common/status.h"

namespace strata::transfer {
namespace {

class FaultChannel : public Channel {
 public:
  FaultChannel(std::unique_ptr<Channel> inner, FaultPolicy policy,
               std::shared_ptr<FaultCounters> counters, uint64_t seed)
      : inner_(std::move(inner)),
        policy_(policy),
        counters_(std::move(counters)),
        rng_(seed),
        timer_([this] { TimerLoop(); }) {}

  ~FaultChannel() override { Close(); }

  void Submit(std::vector<TransferRequest> requests, CompletionFn done) override {
    auto shared_done = std::make_shared<CompletionFn>(std::move(done));
    std::vector<TransferRequest> now;
    std::vector<CompletionFn> fns;
    bool kill = false;
    for (size_t i = 0; i < requests.size(); ++i) {
      TransferRequest& r = requests[i];
      double u_drop, u_delay, u_corrupt, u_kill;
      uint64_t where;
      {
        std::lock_guard<std::mutex> lock(mu_);
        std::uniform_real_distribution<double> u(0, 1);
        u_drop = u(rng_);
        u_delay = u(rng_);
        u_corrupt = u(rng_);
        u_kill = u(rng_);
        where = rng_();
      }
      if (u_drop < policy_.drop) {
        counters_->dropped.fetch_add(1);
        continue;  // lost: only the engine's watchdog will end it
      }
      CompletionFn forward_done = [shared_done, i](size_t, const absl::Status& s) {
        (*shared_done)(i, s);
      };
      if (u_corrupt < policy_.corrupt && r.length > 0) {
        counters_->corrupted.fetch_add(1);
        const uint64_t pos = where % r.length;
        if (r.op == OpKind::kRead) {
          char* local = static_cast<char*>(r.local);
          forward_done = [shared_done, i, local, pos](size_t, const absl::Status& s) {
            if (s.ok()) local[pos] ^= 0x5a;
            (*shared_done)(i, s);
          };
        } else {
          auto copy = std::make_shared<std::vector<char>>(static_cast<char*>(r.local),
                                                          static_cast<char*>(r.local) + r.length);
          (*copy)[pos] ^= 0x5a;
          r.local = copy->data();
          forward_done = [shared_done, i, copy](size_t, const absl::Status& s) {
            (*shared_done)(i, s);
          };
        }
      }
      if (u_kill < policy_.kill) {
        counters_->killed.fetch_add(1);
        kill = true;
      }
      if (u_delay < policy_.delay) {
        counters_->delayed.fetch_add(1);
        std::vector<TransferRequest> one;
        one.push_back(std::move(r));
        Schedule(absl::Now() + policy_.delay_by, std::move(one), std::move(forward_done));
        continue;
      }
      now.push_back(std::move(r));
      fns.push_back(std::move(forward_done));
    }
    if (!now.empty()) {
      inner_->Submit(std::move(now),
                     [fns = std::move(fns)](size_t j, const absl::Status& s) { fns[j](j, s); });
    }
    if (kill) inner_->Disconnect();
  }

  void Close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_all();
    timer_.join();
    // Delayed requests that never left: end them like the transport would.
    for (auto& [when, item] : delayed_) {
      item.second(0, absl::CancelledError("fault channel closed"));
    }
    delayed_.clear();
    inner_->Close();
  }

  void Disconnect() override { inner_->Disconnect(); }

 private:
  using Item = std::pair<std::vector<TransferRequest>, CompletionFn>;

  void Schedule(absl::Time when, std::vector<TransferRequest> requests, CompletionFn done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_) {
        delayed_.emplace(when, Item(std::move(requests), std::move(done)));
        cv_.notify_all();
        return;
      }
    }
    done(0, absl::CancelledError("fault channel closed"));
  }

  void TimerLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!closed_) {
      if (delayed_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto it = delayed_.begin();
      if (absl::Now() < it->first) {
        cv_.wait_for(lock, absl::ToChronoNanoseconds(it->first - absl::Now()));
        continue;
      }
      Item item = std::move(it->second);
      delayed_.erase(it);
      lock.unlock();
      inner_->Submit(std::move(item.first), std::move(item.second));
      lock.lock();
    }
  }

  std::unique_ptr<Channel> inner_;
  const FaultPolicy policy_;
  std::shared_ptr<FaultCounters> counters_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::mt19937_64 rng_;
  std::multimap<absl::Time, Item> delayed_;
  std::thread timer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Channel>> FaultInjectingTransport::Connect(const PeerSpec& peer,
                                                                          const Endpoint& endpoint,
                                                                          absl::Duration timeout) {
  ASSIGN_OR_RETURN(auto inner, inner_->Connect(peer, endpoint, timeout));
  return std::unique_ptr<Channel>(std::make_unique<FaultChannel>(
      std::move(inner), policy_, counters_, policy_.seed * 7919 + channel_seq_.fetch_add(1)));
}

}  // namespace strata::transfer
