# Build options. Optional parts switch whole targets on or off; each is detected and can be
# overridden on the command line (-DSTRATA_WITH_CUDA=OFF). A build without CUDA or RDMA is a
# first-class build.

# ccache, when present, for every language.
find_program(STRATA_CCACHE ccache)
if(STRATA_CCACHE)
  set(CMAKE_C_COMPILER_LAUNCHER ${STRATA_CCACHE})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${STRATA_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${STRATA_CCACHE})
endif()

# CUDA: on when nvcc is found (on PATH, $CUDACXX, or /usr/local/cuda).
if(NOT DEFINED STRATA_WITH_CUDA)
  find_program(_strata_nvcc nvcc HINTS ENV CUDA_HOME PATHS /usr/local/cuda/bin NO_CACHE)
  if(_strata_nvcc)
    set(_strata_cuda_default ON)
    if(NOT DEFINED CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_COMPILER ${_strata_nvcc})
    endif()
  else()
    set(_strata_cuda_default OFF)
  endif()
endif()
option(STRATA_WITH_CUDA "Build the CUDA transport, kernels and backend" ${_strata_cuda_default})
set(STRATA_CUDA_ARCHITECTURES "90a" CACHE STRING "CUDA architectures to build kernels for")

if(STRATA_WITH_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES ${STRATA_CUDA_ARCHITECTURES})
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # CMake 3.25 cannot ask nvcc for C++20, and CUDA targets would otherwise inherit the C++
  # standard: CUDA sources (and the headers they include) are C++17.
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
endif()

# NCCL: on when CUDA is on and the library is found.
find_library(STRATA_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
find_path(STRATA_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
if(STRATA_WITH_CUDA AND STRATA_NCCL_LIBRARY AND STRATA_NCCL_INCLUDE)
  set(_strata_nccl_default ON)
else()
  set(_strata_nccl_default OFF)
endif()
option(STRATA_WITH_NCCL "Build the NCCL transport" ${_strata_nccl_default})

# RDMA: on when libibverbs is found.
find_library(STRATA_IBVERBS_LIBRARY ibverbs)
find_path(STRATA_IBVERBS_INCLUDE infiniband/verbs.h)
if(STRATA_IBVERBS_LIBRARY AND STRATA_IBVERBS_INCLUDE)
  set(_strata_rdma_default ON)
else()
  set(_strata_rdma_default OFF)
endif()
option(STRATA_WITH_RDMA "Build the ibverbs RDMA transport" ${_strata_rdma_default})

# Sanitizers: "address,undefined" or "thread" (scripts/test.sh --sanitize=...).
set(STRATA_SANITIZE "" CACHE STRING "Sanitizers to build with: address,undefined | thread")
if(STRATA_SANITIZE)
  if(STRATA_SANITIZE MATCHES "thread" AND STRATA_SANITIZE MATCHES "address")
    message(FATAL_ERROR "STRATA_SANITIZE: thread cannot be combined with address")
  endif()
  # Host code only: nvcc does not take -fsanitize.
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=${STRATA_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=${STRATA_SANITIZE})
  if(STRATA_SANITIZE MATCHES "thread")
    # libstdc++'s <memory> (shared_ptr atomics) uses atomic_thread_fence, which TSan cannot model;
    # GCC says so in every file that includes it.
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-tsan>)
  endif()
endif()

# Designated initializers leave defaulted members out on purpose; GCC 12 would warn for each.
add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wall> $<$<COMPILE_LANGUAGE:CXX>:-Wextra>
                    $<$<COMPILE_LANGUAGE:CXX>:-Wno-unused-parameter>
                    $<$<COMPILE_LANGUAGE:CXX>:-Wno-missing-field-initializers>)

# 0/1 spellings for generated headers.
foreach(_opt STRATA_WITH_CUDA STRATA_WITH_NCCL STRATA_WITH_RDMA)
  if(${_opt})
    set(${_opt}_01 true)
  else()
    set(${_opt}_01 false)
  endif()
endforeach()
