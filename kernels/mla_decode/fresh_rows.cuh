// The rule of MlaDecodeParams::fresh_rows, for the kernels that load pages before their
// programmatic-launch wait (mla_decode.cuh, mla_decode_sm90.cuh).
#pragma once

#include "kernels/mla_decode/mla_decode.h"

namespace strata::kernels {

// How many whole tiles of `tile_tokens` rows, from the sequence's first, hold only rows that
// fresh_rows promises complete before the kernel ahead started (rows below seqlen - fresh_rows).
__device__ __forceinline__ int MlaSettledTiles(const MlaDecodeParams& p, int seqlen,
                                               int tile_tokens) {
  return max(0, seqlen - p.fresh_rows) / tile_tokens;
}

}  // namespace strata::kernels
