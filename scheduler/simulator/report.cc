#include "scheduler/simulator/report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "common/status.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace strata::scheduler::sim {

Percentiles ComputePercentiles(std::vector<double> values) {
  Percentiles p;
  if (values.empty()) return p;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  p.mean = sum / double(values.size());
  const auto rank = [&](double q) {
    const size_t i = size_t(std::ceil(q * double(values.size())));
    return values[std::clamp<size_t>(i, 1, values.size()) - 1];
  };
  p.p50 = rank(0.50);
  p.p90 = rank(0.90);
  p.p99 = rank(0.99);
  return p;
}

PolicySummary Summarize(const SimulationResult& result, const Objectives& objectives,
                        double bucket_s) {
  PolicySummary s;
  s.policy = result.policy;
  s.requests = result.requests.size();
  s.moved_blocks = result.moved_blocks;
  s.makespan_s = result.makespan_s;
  s.bucket_s = bucket_s;
  s.calibrated_prefill = result.calibrated_prefill;
  std::vector<double> ttft, tbt;
  double hit = 0, prompt = 0;
  uint64_t good = 0, good_tokens = 0;
  std::vector<double> bucket_hit, bucket_total;
  for (const RequestOutcome& r : result.requests) {
    const size_t bucket = size_t(r.arrival_s / bucket_s);
    if (bucket >= bucket_total.size()) {
      bucket_hit.resize(bucket + 1, 0);
      bucket_total.resize(bucket + 1, 0);
    }
    if (r.rejected) {
      ++s.rejected;
      continue;
    }
    ++s.completed;
    ttft.push_back(r.ttft_s);
    if (r.output_tokens > 1) tbt.push_back(r.tbt_s);
    hit += double(r.cached_tokens);
    prompt += double(r.prompt_tokens);
    bucket_hit[bucket] += double(r.cached_tokens);
    bucket_total[bucket] += double(r.prompt_tokens);
    if (r.ttft_s <= objectives.ttft_s && r.tbt_s <= objectives.tbt_s) {
      ++good;
      good_tokens += r.output_tokens;
    }
  }
  s.token_hit_ratio = prompt > 0 ? hit / prompt : 0;
  s.ttft_s = ComputePercentiles(ttft);
  s.tbt_s = ComputePercentiles(tbt);
  s.decision_us = ComputePercentiles(result.decision_us);
  s.slo_attainment = s.requests > 0 ? double(good) / double(s.requests) : 0;
  if (s.makespan_s > 0) {
    s.goodput_rps = double(good) / s.makespan_s;
    s.goodput_tokens_per_s = double(good_tokens) / s.makespan_s;
  }
  for (size_t b = 0; b < bucket_total.size(); ++b) {
    s.hit_ratio_over_time.push_back(bucket_total[b] > 0 ? bucket_hit[b] / bucket_total[b] : 0);
  }
  std::sort(ttft.begin(), ttft.end());
  s.ttft_sorted = std::move(ttft);
  return s;
}

namespace {

nlohmann::json PercentilesJson(const Percentiles& p) {
  return {{"mean", p.mean}, {"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}};
}

const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728", "#8c564b"};

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string Fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string XmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::string ReportJson(const ReplayReport& report) {
  nlohmann::json j;
  j["trace"] = report.trace;
  j["cluster"] = report.cluster;
  j["unlimited_cache_hit_ratio"] = report.unlimited_hit_ratio;
  j["objectives"] = {{"ttft_s", report.objectives.ttft_s},
                     {"tbt_s", report.objectives.tbt_s},
                     {"reject_factor", report.objectives.reject_factor}};
  nlohmann::json policies = nlohmann::json::array();
  for (const PolicySummary& s : report.policies) {
    policies.push_back({
        {"policy", s.policy},
        {"requests", s.requests},
        {"completed", s.completed},
        {"rejected", s.rejected},
        {"token_hit_ratio", s.token_hit_ratio},
        {"ttft_s", PercentilesJson(s.ttft_s)},
        {"tbt_s", PercentilesJson(s.tbt_s)},
        {"slo_attainment", s.slo_attainment},
        {"goodput_rps", s.goodput_rps},
        {"goodput_tokens_per_s", s.goodput_tokens_per_s},
        {"moved_blocks", s.moved_blocks},
        {"decision_us", PercentilesJson(s.decision_us)},
        {"makespan_s", s.makespan_s},
        {"hit_ratio_bucket_s", s.bucket_s},
        {"hit_ratio_over_time", s.hit_ratio_over_time},
        {"calibrated_prefill",
         {{"base_s", s.calibrated_prefill.base_s},
          {"per_token_s", s.calibrated_prefill.per_token_s},
          {"per_pair_s", s.calibrated_prefill.per_pair_s}}},
    });
  }
  j["policies"] = std::move(policies);
  return j.dump(2) + "\n";
}

std::string ReportTable(const ReplayReport& report) {
  std::string out = StrCat(
      "trace: ", report.trace, "\ncluster: ", report.cluster,
      "\nunlimited-cache token hit ratio (upper bound): ", Fixed(report.unlimited_hit_ratio, 3),
      "\nobjectives: TTFT <= ", report.objectives.ttft_s, " s, TBT <= ", report.objectives.tbt_s,
      " s\n\n");
  char line[512];
  std::snprintf(line, sizeof(line), "%-18s %7s %6s %8s %8s %8s %8s %8s %8s %8s %6s %8s %8s\n",
                "policy", "hit", "rej", "ttft_avg", "ttft_p50", "ttft_p90", "ttft_p99", "tbt_p50",
                "tbt_p99", "slo", "good/s", "moved", "dec_p99us");
  out += line;
  for (const PolicySummary& s : report.policies) {
    std::snprintf(line, sizeof(line),
                  "%-18s %7.3f %6llu %8.3f %8.3f %8.3f %8.3f %8.4f %8.4f %8.3f %6.2f %8llu %8.1f\n",
                  s.policy.c_str(), s.token_hit_ratio, (unsigned long long)s.rejected,
                  s.ttft_s.mean, s.ttft_s.p50, s.ttft_s.p90, s.ttft_s.p99, s.tbt_s.p50, s.tbt_s.p99,
                  s.slo_attainment, s.goodput_rps, (unsigned long long)s.moved_blocks,
                  s.decision_us.p99);
    out += line;
  }
  return out;
}

std::string ReportSvg(const ReplayReport& report) {
  // Two panels side by side: TTFT CDF (log-scaled x) and hit ratio over time.
  constexpr double kW = 1000, kH = 420, kPanelW = 420, kPanelH = 300, kTop = 60;
  constexpr double kLeft1 = 60, kLeft2 = 560;
  if (report.policies.empty()) {
    return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\" height=\"10\"/>\n";
  }
  std::string svg = StrCat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", kW, "\" height=\"", kH,
      "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n<text x=\"",
      kW / 2, "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">",
      XmlEscape(StrCat("strata bench replay: ", report.trace)), "</text>\n");
  // Axes.
  for (double left : {kLeft1, kLeft2}) {
    StrAppend(&svg, "<rect x=\"", left, "\" y=\"", kTop, "\" width=\"", kPanelW, "\" height=\"",
              kPanelH, "\" fill=\"none\" stroke=\"#444\"/>\n");
  }
  double max_ttft = 0.01, min_ttft = 1e9;
  for (const PolicySummary& s : report.policies) {
    if (!s.ttft_sorted.empty()) {
      max_ttft = std::max(max_ttft, s.ttft_sorted.back());
      min_ttft = std::min(min_ttft, std::max(s.ttft_sorted.front(), 1e-3));
    }
  }
  if (min_ttft > max_ttft) min_ttft = 1e-3;
  const double lo = std::floor(std::log10(min_ttft)), hi = std::ceil(std::log10(max_ttft));
  const double span = std::max(hi - lo, 1.0);
  const auto x_of = [&](double t) {
    return kLeft1 + (std::log10(std::max(t, 1e-3)) - lo) / span * kPanelW;
  };
  for (double d = lo; d <= lo + span; d += 1) {
    const double x = kLeft1 + (d - lo) / span * kPanelW;
    StrAppend(&svg, "<line x1=\"", Num(x), "\" y1=\"", kTop + kPanelH, "\" x2=\"", Num(x),
              "\" y2=\"", kTop, "\" stroke=\"#ddd\"/>\n<text x=\"", Num(x), "\" y=\"",
              kTop + kPanelH + 16, "\" text-anchor=\"middle\">",
              Fixed(std::pow(10.0, d), d < 0 ? int(-d) : 0), "</text>\n");
  }
  for (int q = 0; q <= 4; ++q) {
    const double y = kTop + kPanelH - q * kPanelH / 4;
    StrAppend(&svg, "<text x=\"", kLeft1 - 6, "\" y=\"", Num(y + 4), "\" text-anchor=\"end\">",
              Fixed(q * 0.25, 2), "</text>\n<text x=\"", kLeft2 - 6, "\" y=\"", Num(y + 4),
              "\" text-anchor=\"end\">", Fixed(q * 0.25, 2), "</text>\n");
  }
  StrAppend(&svg, "<text x=\"", kLeft1 + kPanelW / 2, "\" y=\"", kTop + kPanelH + 34,
            "\" text-anchor=\"middle\">TTFT (s, log scale)</text>\n<text x=\"",
            kLeft1 + kPanelW / 2, "\" y=\"", kTop - 8,
            "\" text-anchor=\"middle\">CDF of time to first token</text>\n");
  StrAppend(&svg, "<text x=\"", kLeft2 + kPanelW / 2, "\" y=\"", kTop + kPanelH + 34,
            "\" text-anchor=\"middle\">arrival time (min)</text>\n<text x=\"", kLeft2 + kPanelW / 2,
            "\" y=\"", kTop - 8, "\" text-anchor=\"middle\">token hit ratio over time</text>\n");
  size_t max_buckets = 1;
  for (const PolicySummary& s : report.policies) {
    max_buckets = std::max(max_buckets, s.hit_ratio_over_time.size());
  }
  for (size_t i = 0; i < report.policies.size(); ++i) {
    const PolicySummary& s = report.policies[i];
    const char* color = kColors[i % std::size(kColors)];
    // CDF, downsampled to at most ~400 points.
    std::string points;
    const size_t n = s.ttft_sorted.size();
    const size_t step = std::max<size_t>(1, n / 400);
    for (size_t k = 0; k < n; k += step) {
      const double y = kTop + kPanelH - double(k + 1) / double(n) * kPanelH;
      StrAppend(&points, Num(x_of(s.ttft_sorted[k])), ",", Num(y), " ");
    }
    if (n > 0) StrAppend(&points, Num(x_of(s.ttft_sorted.back())), ",", Num(kTop));
    StrAppend(&svg, "<polyline fill=\"none\" stroke=\"", color, "\" stroke-width=\"2\" points=\"",
              points, "\"/>\n");
    points.clear();
    for (size_t b = 0; b < s.hit_ratio_over_time.size(); ++b) {
      const double x = kLeft2 + (double(b) + 0.5) / double(max_buckets) * kPanelW;
      const double y = kTop + kPanelH - s.hit_ratio_over_time[b] * kPanelH;
      StrAppend(&points, Num(x), ",", Num(y), " ");
    }
    StrAppend(&svg, "<polyline fill=\"none\" stroke=\"", color, "\" stroke-width=\"2\" points=\"",
              points, "\"/>\n");
    const double ly = kTop + kPanelH + 56 + 0;
    const double lx = 60 + double(i) * 170;
    StrAppend(&svg, "<rect x=\"", lx, "\" y=\"", ly - 10, "\" width=\"14\" height=\"4\" fill=\"",
              color, "\"/><text x=\"", lx + 20, "\" y=\"", ly - 4, "\">",
              XmlEscape(StrCat(s.policy, " (hit ", Fixed(s.token_hit_ratio, 2), ")")), "</text>\n");
  }
  // Unlimited-cache bound on the hit-ratio panel.
  const double yb = kTop + kPanelH - report.unlimited_hit_ratio * kPanelH;
  StrAppend(&svg, "<line x1=\"", kLeft2, "\" y1=\"", Num(yb), "\" x2=\"", kLeft2 + kPanelW,
            "\" y2=\"", Num(yb), "\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>\n<text x=\"",
            kLeft2 + kPanelW - 4, "\" y=\"", Num(yb - 4),
            "\" text-anchor=\"end\" fill=\"#666\">unlimited cache</text>\n");
  for (int m = 0; m <= 4; ++m) {
    const double minutes = double(max_buckets) * report.policies.front().bucket_s / 60 * m / 4;
    const double x = kLeft2 + m * kPanelW / 4;
    StrAppend(&svg, "<text x=\"", Num(x), "\" y=\"", kTop + kPanelH + 16,
              "\" text-anchor=\"middle\">", Fixed(minutes, 0), "</text>\n");
  }
  svg += "</svg>\n";
  return svg;
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return ErrnoToStatus(errno, StrCat("opening ", path, " for writing"));
  out << contents;
  out.close();
  if (!out) return ErrnoToStatus(errno, StrCat("writing ", path));
  return absl::OkStatus();
}

}  // namespace strata::scheduler::sim
