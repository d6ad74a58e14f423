# hook.def_check: hook/cmake/check_def_subset.cmake accepts the hook's real entry-point lists and
# rejects a hooked.def with a row that cuda_api.def lacks (tests/hook/fixtures/bad_hooked.def),
# naming that row. Run with -DSOURCE_DIR=<project root> -P def_check_test.cmake.
set(_check "${SOURCE_DIR}/hook/cmake/check_def_subset.cmake")
set(_api "${SOURCE_DIR}/common/include/vlake/common/cuda_api.def")
set(_dir "${SOURCE_DIR}/hook/src/interposer")

function(run_check hooked out_rc out_text)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" "-DVLAKE_API_DEF=${_api}" "-DVLAKE_HOOKED_DEF=${hooked}" "-DVLAKE_USED_DEF=${_dir}/used.def"
            "-DVLAKE_GAPS=${_dir}/not_in_cuda_api.txt" -P "${_check}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_rc} "${rc}" PARENT_SCOPE)
  set(${out_text} "${out}${err}" PARENT_SCOPE)
endfunction()

run_check("${_dir}/hooked.def" rc text)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the real hooked.def was rejected:\n${text}")
endif()
run_check("${SOURCE_DIR}/tests/hook/fixtures/bad_hooked.def" rc text)
if(rc EQUAL 0)
  message(FATAL_ERROR "a hooked.def with a bogus row was accepted")
endif()
if(NOT text MATCHES "cuBogusEntry_v9")
  message(FATAL_ERROR "the rejection does not name the bogus row:\n${text}")
endif()
if(text MATCHES "cuMemAlloc_v2")
  message(FATAL_ERROR "the rejection names a good row:\n${text}")
endif()
message(STATUS "bad row rejected: ${text}")
