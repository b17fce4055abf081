// strata info: how this binary was built and which accelerators it can use.
#include <fmt/format.h>

#include <iostream>

#include "cli/commands.h"
#include "common/build_info.h"
#include "common/config.h"
#include "common/strings.h"
#if STRATA_WITH_CUDA
#include "common/cuda/device_info.h"
#endif

namespace strata::cli {

void RegisterInfoCommand(CLI::App& app) {
  CLI::App* info = app.add_subcommand("info", "Show build options and the devices found");
  auto self_test = std::make_shared<bool>(false);
  info->add_flag("--self-test", *self_test, "Run a kernel on every GPU and check its output");
  info->callback([self_test] {
    std::cout << fmt::format("strata {} ({}, {})\n", kVersion, kBuildType, kCompiler);
    std::cout << fmt::format(
        "  cuda: {}  nccl: {}  rdma: {}  sanitize: {}\n",
        kWithCuda ? StrCat("on (sm_", kCudaArchitectures, ")") : std::string("off"),
        kWithNccl ? "on" : "off", kWithRdma ? "on" : "off", *kSanitize ? kSanitize : "none");
#if STRATA_WITH_CUDA
    auto devices = ListCudaDevices();
    if (!devices.ok()) {
      std::cout << "  gpus: none (" << devices.status().message() << ")\n";
      return;
    }
    std::cout << "  gpus: " << devices->size() << "\n";
    int failures = 0;
    for (const auto& d : *devices) {
      std::cout << fmt::format("    [{}] {} sm_{}{}, {} SMs, {} free of {}, {}", d.index, d.name,
                               d.sm_major, d.sm_minor, d.num_sms,
                               FormatBytes(d.free_memory_bytes / (1 << 20) << 20),
                               FormatBytes(d.total_memory_bytes / (1 << 20) << 20), d.pci_bus_id);
      if (*self_test) {
        const absl::Status st = SelfTestCudaDevice(d.index);
        std::cout << (st.ok() ? "  self-test ok" : "  self-test FAILED: " + st.ToString());
        failures += !st.ok();
      }
      std::cout << "\n";
    }
    if (failures > 0) throw CLI::RuntimeError(1);
#else
    std::cout << "  gpus: not built with CUDA\n";
#endif
  });
}

}  // namespace strata::cli
