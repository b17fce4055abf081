// This host's name: the default host id of every daemon (same host id = shm and CUDA peer copy
// are possible between two processes).
#pragma once

#include <unistd.h>

#include <string>

namespace strata {

inline std::string HostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace strata
