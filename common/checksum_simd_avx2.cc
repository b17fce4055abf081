// xxh3 built for avx2 (compile flags in common/CMakeLists.txt); see checksum_simd.inc.
#define STRATA_XXH3_VARIANT Avx2Variant
#define STRATA_XXH3_NAME "avx2"
#include "common/checksum_simd.inc"
