#include "compute_nodes/worker/worker_internal.h"

namespace strata::worker::internal {

CoreMetrics& Metrics() {
  static CoreMetrics* m = [] {
    MetricsRegistry& r = MetricsRegistry::Default();
    auto& prompt =
        r.AddCounter("strata_worker_prompt_tokens_total",
                     "Prompt tokens by source: computed, loaded from a cache server (cache), or "
                     "found in the worker's own KV pool (resident)",
                     {"source"});
    return new CoreMetrics{
        .computed = prompt.Labels({"computed"}),
        .cached = prompt.Labels({"cache"}),
        .resident = prompt.Labels({"resident"}),
        .generated =
            r.AddCounter("strata_worker_generated_tokens_total", "Tokens generated", {}).Labels({}),
        .swaps = r.AddCounter("strata_worker_swaps_total",
                              "Sequences swapped out or in under page pressure", {"direction"}),
        .requests = r.AddCounter("strata_worker_requests_total", "Requests finished, by outcome",
                                 {"outcome"}),
        .step = r.AddHistogram("strata_worker_step_seconds", "Engine step time", {},
                               ExponentialBuckets(1e-4, 2, 16))
                    .Labels({}),
        .queued = r.AddGauge("strata_worker_queued_requests",
                             "Requests waiting for pages (new or swapped out)", {})
                      .Labels({}),
        .running = r.AddGauge("strata_worker_running_requests",
                              "Requests holding KV pages (loading, prefilling, decoding)", {})
                       .Labels({}),
        .free_pages = r.AddGauge("strata_worker_free_kv_pages",
                                 "Pages of the KV pool that can be had now: free, or held only by "
                                 "idle resident blocks",
                                 {})
                          .Labels({}),
        .resident_blocks = r.AddGauge("strata_worker_resident_blocks",
                                      "Full KV blocks kept in the worker's KV pool, found again by "
                                      "key (held by running sequences or idle)",
                                      {})
                               .Labels({}),
    };
  }();
  return *m;
}

}  // namespace strata::worker::internal
