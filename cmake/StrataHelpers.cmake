# Target helpers used in every folder, in the style of Abseil's CMake:
#
#   strata_cc_library(NAME foo SRCS foo.cc HDRS foo.h DEPS strata::bar absl::status)
#   strata_cc_binary(NAME strata SRCS main.cc DEPS ...)
#   strata_cc_test(NAME foo_test SRCS foo_test.cc DEPS strata::foo LABELS unit [TIMEOUT 60])
#
# Libraries get the alias strata::NAME. Sources are listed explicitly. Every test is one
# executable, registered with CTest under its labels (unit, integration, gpu, rdma, slow).
# A test that calls GTEST_SKIP() is reported by CTest as skipped, never as passed.

function(strata_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;HDRS;DEPS;DEFINES" ${ARGN})
  if(ARG_SRCS)
    add_library(${ARG_NAME} STATIC ${ARG_SRCS} ${ARG_HDRS})
    target_include_directories(${ARG_NAME} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS})
    target_compile_definitions(${ARG_NAME} PUBLIC ${ARG_DEFINES})
  else()
    add_library(${ARG_NAME} INTERFACE ${ARG_HDRS})
    target_include_directories(${ARG_NAME} INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${ARG_NAME} INTERFACE ${ARG_DEPS})
    target_compile_definitions(${ARG_NAME} INTERFACE ${ARG_DEFINES})
  endif()
  add_library(strata::${ARG_NAME} ALIAS ${ARG_NAME})
endfunction()

function(strata_cc_binary)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
endfunction()

function(strata_cc_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;ARGS;ENV" ${ARGN})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR})  # "tests/util/..."
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} strata::test_main)
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME} ${ARG_ARGS})
  # TSAN_OPTIONS only matters in TSan builds (STRATA_SANITIZE=thread): tests/tsan.supp hides races
  # inside the uninstrumented Debian libraries, and a race in Strata's own code stops the test.
  set(_tsan "TSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1")
  set_tests_properties(${ARG_NAME} PROPERTIES
    LABELS "${ARG_LABELS}"
    TIMEOUT ${ARG_TIMEOUT}
    SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    ENVIRONMENT "STRATA_SOURCE_DIR=${PROJECT_SOURCE_DIR};STRATA_BINARY_DIR=${PROJECT_BINARY_DIR};${_tsan};${ARG_ENV}")
endfunction()

function(strata_cc_benchmark)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} benchmark::benchmark)
endfunction()
