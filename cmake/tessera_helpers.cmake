# tessera_test(NAME SOURCES ... LIBS ... LABEL unit|multiproc|golden|slow [TIMEOUT s]):
# one GoogleTest binary whose cases are registered with CTest under one label.
# (One label only: gtest_discover_tests loses list separators in PROPERTIES.)
# `make test-asan` rebuilds the binaries named in the Makefile's ASAN_TARGETS.

# Every test's environment: the comm copy-mode calibration (docs/comm.md) caches in
# the build tree, not in the user's ~/.cache; the first test whose ranks are
# processes measures it (~0.1 s) and the rest read it.
set(TESSERA_TEST_ENVIRONMENT "TESSERA_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")

function(tessera_test name)
  cmake_parse_arguments(T "" "TIMEOUT;LABEL" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_definitions(${name} PRIVATE TESSERA_SHARED_DIR="${TESSERA_SHARED_DIR}"
                                             TESSERA_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  # GoogleTest's header costs ~1.7 s a file; parse it once per binary of several files.
  list(LENGTH T_SOURCES n_sources)
  if(n_sources GREATER 2)
    target_precompile_headers(${name} PRIVATE <gtest/gtest.h>)
  endif()
  # The project's own headers a test includes (model, engine, comm) are parsed once
  # per batch of four files rather than once per file.
  set_target_properties(${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 4)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(NOT T_LABEL)
    set(T_LABEL unit)
  endif()
  gtest_discover_tests(${name} PROPERTIES LABELS ${T_LABEL} TIMEOUT ${T_TIMEOUT}
                                          ENVIRONMENT "${TESSERA_TEST_ENVIRONMENT}"
                       DISCOVERY_TIMEOUT 60)
endfunction()

# tessera_test_environment(): gives the tests added so far in this directory with
# add_test (the scripts) TESSERA_TEST_ENVIRONMENT; call it at the end of the file.
function(tessera_test_environment)
  get_property(tests DIRECTORY PROPERTY TESTS)
  if(tests)
    set_property(TEST ${tests} APPEND PROPERTY ENVIRONMENT "${TESSERA_TEST_ENVIRONMENT}")
  endif()
endfunction()
