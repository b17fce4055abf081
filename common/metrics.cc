#include "common/metrics.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "common/strings.h"

namespace strata {
namespace {

bool ValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool ValidLabelName(std::string_view name) {
  return ValidMetricName(name) && name.find(':') == std::string_view::npos &&
         !name.starts_with("__");
}

void AppendEscaped(std::string* out, std::string_view s, bool quote_too) {
  for (char c : s) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (quote_too && c == '"') {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Whole numbers (byte and event counts) print as integers, not in exponent form.
  if (std::fabs(v) < 1e15 && v == std::floor(v)) return StrCat(static_cast<int64_t>(v));
  return StrCat(v);
}

// {a="x",b="y"} plus an optional extra label (le for histogram buckets).
std::string LabelSet(const std::vector<std::string>& names, const std::vector<std::string>& values,
                     std::string_view extra_name = {}, std::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out.push_back(',');
    StrAppend(&out, names[i], "=\"");
    AppendEscaped(&out, values[i], true);
    out.push_back('"');
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out.push_back(',');
    StrAppend(&out, extra_name, "=\"", extra_value, "\"");
  }
  out.push_back('}');
  return out;
}

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

void Counter::Increment(double delta) {
  if (delta > 0) value_.fetch_add(delta, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 1; i < bounds_.size(); ++i) {
    STRATA_CHECK(bounds_[i - 1] < bounds_[i], "histogram bounds must increase strictly");
  }
}

void Histogram::Observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> counts(bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) {
    counts[i] = buckets_[i].load(std::memory_order_relaxed);
  }
  return counts;
}

MetricFamilyBase::MetricFamilyBase(std::string name, std::string help, MetricType type,
                                   std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {}

template <typename T>
T& MetricFamily<T>::Labels(const std::vector<std::string>& values) {
  STRATA_CHECK(values.size() == label_names_.size(), name_.c_str());
  std::lock_guard lock(mu_);
  auto& child = children_[values];
  if (child == nullptr) {
    if constexpr (std::is_same_v<T, Histogram>) {
      child = std::make_unique<Histogram>(bounds_);
    } else {
      child = std::make_unique<T>();
    }
  }
  return *child;
}

template <typename T>
void MetricFamily<T>::Render(std::string* out) const {
  StrAppend(out, "# HELP ", name_, " ");
  AppendEscaped(out, help_, false);
  StrAppend(out, "\n# TYPE ", name_, " ", TypeName(type_), "\n");
  std::lock_guard lock(mu_);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      const std::vector<uint64_t> counts = child->BucketCounts();
      uint64_t cumulative = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        cumulative += counts[i];
        const std::string le = i < bounds_.size() ? FormatValue(bounds_[i]) : "+Inf";
        StrAppend(out, name_, "_bucket", LabelSet(label_names_, values, "le", le), " ", cumulative,
                  "\n");
      }
      // Read count from the buckets so that the +Inf bucket and _count agree in one scrape.
      StrAppend(out, name_, "_sum", LabelSet(label_names_, values), " ", FormatValue(child->Sum()),
                "\n");
      StrAppend(out, name_, "_count", LabelSet(label_names_, values), " ", cumulative, "\n");
    } else {
      StrAppend(out, name_, LabelSet(label_names_, values), " ", FormatValue(child->Value()), "\n");
    }
  }
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;
template class MetricFamily<Histogram>;

MetricsRegistry& MetricsRegistry::Default() {
  static MetricsRegistry* registry = new MetricsRegistry();
  return *registry;
}

template <typename T>
MetricFamily<T>& MetricsRegistry::AddFamily(const std::string& name, const std::string& help,
                                            MetricType type, std::vector<std::string> label_names) {
  STRATA_CHECK(ValidMetricName(name), name.c_str());
  for (const auto& label : label_names) {
    STRATA_CHECK(ValidLabelName(label), label.c_str());
    STRATA_CHECK(!(type == MetricType::kHistogram && label == "le"), "'le' is reserved");
  }
  std::lock_guard lock(mu_);
  auto& family = families_[name];
  if (family != nullptr) {
    STRATA_CHECK(family->type() == type && family->label_names() == label_names,
                 ("metric registered twice with different shapes: " + name).c_str());
    return static_cast<MetricFamily<T>&>(*family);
  }
  family = std::make_unique<MetricFamily<T>>(name, help, type, std::move(label_names));
  return static_cast<MetricFamily<T>&>(*family);
}

MetricFamily<Counter>& MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                                   std::vector<std::string> label_names) {
  return AddFamily<Counter>(name, help, MetricType::kCounter, std::move(label_names));
}

MetricFamily<Gauge>& MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                               std::vector<std::string> label_names) {
  return AddFamily<Gauge>(name, help, MetricType::kGauge, std::move(label_names));
}

MetricFamily<Histogram>& MetricsRegistry::AddHistogram(const std::string& name,
                                                       const std::string& help,
                                                       std::vector<std::string> label_names,
                                                       std::vector<double> bounds) {
  STRATA_CHECK(!bounds.empty(), "a histogram needs bucket bounds");
  auto& family = AddFamily<Histogram>(name, help, MetricType::kHistogram, std::move(label_names));
  std::lock_guard lock(family.mu_);
  if (family.bounds_.empty()) family.bounds_ = std::move(bounds);
  return family;
}

std::string MetricsRegistry::RenderPrometheus() const {
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& [name, family] : families_) family->Render(&out);
  return out;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  STRATA_CHECK(start > 0 && factor > 1 && count > 0, "bad exponential bucket parameters");
  std::vector<double> bounds(count);
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) bounds[i] = v;
  return bounds;
}

}  // namespace strata
