// transfer_test_peer: a segment-owning peer process for the cross-process transfer tests.
#include <iostream>
#include <string>
#include <vector>

#include "transfer/peer_process.h"

int main(int argc, char** argv) {
  auto options =
      strata::transfer::ParsePeerProcessArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!options.ok()) {
    std::cerr << options.status() << "\n";
    return 2;
  }
  return strata::transfer::RunPeerProcess(*options);
}
