#include "compute_nodes/worker/worker_internal.h"

namespace strata::worker::internal {

CoreMetrics& Metrics() {
  static CoreMetrics* m = [] {
    MetricsRegistry& r = MetricsRegistry::Default();
    auto& prompt =
        r.AddCounter("strata_worker_prompt_tokens_total",
                     "Prompt tokens by source (computed or loaded from cache)", {"source"});
    return new CoreMetrics{
        .computed = prompt.Labels({"computed"}),
        .cached = prompt.Labels({"cache"}),
        .generated =
            r.AddCounter("strata_worker_generated_tokens_total", "Tokens generated", {}).Labels({}),
        .swaps = r.AddCounter("strata_worker_swaps_total",
                              "Sequences swapped out or in under page pressure", {"direction"}),
        .requests = r.AddCounter("strata_worker_requests_total", "Requests finished, by outcome",
                                 {"outcome"}),
        .step = r.AddHistogram("strata_worker_step_seconds", "Engine step time", {},
                               ExponentialBuckets(1e-4, 2, 16))
                    .Labels({}),
    };
  }();
  return *m;
}

}  // namespace strata::worker::internal
