// STRATA_CHECK guards invariants: a failed check is a bug in Strata, never bad input or a bad
// environment (those are statuses). It prints where and why, then aborts.
#pragma once

#include <cstdio>
#include <cstdlib>

#define STRATA_CHECK(cond, msg)                                                                \
  do {                                                                                         \
    if (!(cond)) [[unlikely]] {                                                                \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, (msg)); \
      std::abort();                                                                            \
    }                                                                                          \
  } while (false)
