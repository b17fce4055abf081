// Metrics with labels, rendered in the Prometheus text exposition format (version 0.0.4).
//
//   MetricsRegistry& m = MetricsRegistry::Default();
//   auto& hits = m.AddCounter("strata_cache_hits_total", "Blocks served", {"tier"});
//   Counter& dram_hits = hits.Labels({"dram"});   // keep the reference: lookups take a lock
//   dram_hits.Increment();
//
//   auto& latency = m.AddHistogram("strata_lookup_seconds", "Lookup latency", {},
//                                  ExponentialBuckets(1e-6, 4, 10));
//   latency.Labels({}).Observe(12e-6);
//
// Updating a metric is lock-free. Registering the same family twice with the same type and labels
// returns the first one; a clash, or an invalid name, is a programming error (abort).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace strata {

class Counter {
 public:
  // `delta` must be >= 0; negative deltas are ignored (counters only go up).
  void Increment(double delta = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta) { value_.fetch_add(delta, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // `bounds`: upper bounds of the buckets, strictly increasing (+Inf is implicit).
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket (not cumulative) counts; the last entry is the +Inf bucket.
  std::vector<uint64_t> BucketCounts() const;
  uint64_t Count() const { return count_.load(std::memory_order_relaxed); }
  double Sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

class MetricFamilyBase {
 public:
  MetricFamilyBase(std::string name, std::string help, MetricType type,
                   std::vector<std::string> label_names);
  virtual ~MetricFamilyBase() = default;

  const std::string& name() const { return name_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Appends this family's HELP, TYPE and sample lines to `out`.
  virtual void Render(std::string* out) const = 0;

 protected:
  std::string name_;
  std::string help_;
  MetricType type_;
  std::vector<std::string> label_names_;
};

// All children of one metric name, one per combination of label values.
template <typename T>
class MetricFamily : public MetricFamilyBase {
 public:
  using MetricFamilyBase::MetricFamilyBase;

  // The child for these label values (in the order of the label names), created on first use.
  // The reference stays valid for the registry's lifetime.
  T& Labels(const std::vector<std::string>& values);

  void Render(std::string* out) const override;

 private:
  friend class MetricsRegistry;
  std::vector<double> bounds_;  // histograms only
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

class MetricsRegistry {
 public:
  // The process-wide registry that /metrics serves.
  static MetricsRegistry& Default();

  MetricFamily<Counter>& AddCounter(const std::string& name, const std::string& help,
                                    std::vector<std::string> label_names = {});
  MetricFamily<Gauge>& AddGauge(const std::string& name, const std::string& help,
                                std::vector<std::string> label_names = {});
  MetricFamily<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds);

  // Every family, sorted by name, in the Prometheus text format.
  std::string RenderPrometheus() const;

 private:
  template <typename T>
  MetricFamily<T>& AddFamily(const std::string& name, const std::string& help, MetricType type,
                             std::vector<std::string> label_names);

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<MetricFamilyBase>> families_ ABSL_GUARDED_BY(mu_);
};

// `count` bounds: start, start·factor, start·factor², ...
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// The content type of RenderPrometheus() output.
inline constexpr std::string_view kPrometheusContentType = "text/plain; version=0.0.4";

}  // namespace strata
