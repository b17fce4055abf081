// xxh3 built for sse2 (compile flags in common/CMakeLists.txt); see checksum_simd.inc.
#define STRATA_XXH3_VARIANT Sse2Variant
#define STRATA_XXH3_NAME "sse2"
#include "common/checksum_simd.inc"
