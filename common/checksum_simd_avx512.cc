// xxh3 built for avx512 (compile flags in common/CMakeLists.txt); see checksum_simd.inc.
#define STRATA_XXH3_VARIANT Avx512Variant
#define STRATA_XXH3_NAME "avx512"
#include "common/checksum_simd.inc"
