# Checks that every row of the hook's entry-point lists names an entry point of the driver API
# list (common/include/vlake/common/cuda_api.def): each VLAKE_HOOK row of hooked.def must match a
# VLAKE_CU_API / VLAKE_CU_API_OPTIONAL row of cuda_api.def in base, symbol and version; each
# VLAKE_HOOK_PTSZ row and each VLAKE_USED row of used.def must name a symbol of cuda_api.def.
# `gaps_file` lists, one symbol a line (# comments), the entry points the hook uses that
# cuda_api.def (and so the simulator) does not have yet: they are accepted, and the list may
# only shrink: a listed symbol that cuda_api.def has, or that no row names, is an error too.
#
# include()d by hook/CMakeLists.txt (configure time: a bad row stops the configure) and run as
# a script by tests/hook (cmake -DVLAKE_API_DEF=... -DVLAKE_HOOKED_DEF=... -DVLAKE_USED_DEF=...
# -DVLAKE_GAPS=... -P check_def_subset.cmake): the exit status is non-zero and the bad rows are named.

cmake_policy(SET CMP0057 NEW)  # if(IN_LIST), also when run as a script

function(vlake_check_def_subset api_def hooked_def used_def gaps_file)
  file(STRINGS "${gaps_file}" _gaps REGEX "^[A-Za-z0-9_]+$")
  set(_gaps_used "")
  file(STRINGS "${api_def}" _api_rows REGEX "^VLAKE_CU_API(_OPTIONAL)?\\(")
  set(_api_triples "")
  set(_api_symbols "")
  foreach(row IN LISTS _api_rows)
    if(row MATCHES "^VLAKE_CU_API(_OPTIONAL)?\\(([A-Za-z0-9_]+), *([A-Za-z0-9_]+), *([0-9]+)\\)")
      list(APPEND _api_triples "${CMAKE_MATCH_2}/${CMAKE_MATCH_3}/${CMAKE_MATCH_4}")
      list(APPEND _api_symbols "${CMAKE_MATCH_3}")
    endif()
  endforeach()
  if(NOT _api_triples)
    message(FATAL_ERROR "${api_def}: no VLAKE_CU_API rows")
  endif()
  set(_bad "")
  file(STRINGS "${hooked_def}" _hook_rows REGEX "^VLAKE_HOOK(_PTSZ)?\\(")
  foreach(row IN LISTS _hook_rows)
    if(row MATCHES "^VLAKE_HOOK\\(([A-Za-z0-9_]+), *([A-Za-z0-9_]+), *([0-9]+)\\)")
      set(_symbol "${CMAKE_MATCH_2}")
      set(_triple "${CMAKE_MATCH_1}/${CMAKE_MATCH_2}/${CMAKE_MATCH_3}")
    elseif(row MATCHES "^VLAKE_HOOK_PTSZ\\(([A-Za-z0-9_]+), *([A-Za-z0-9_]+), *[A-Za-z0-9_]+, *([0-9]+)\\)")
      set(_symbol "${CMAKE_MATCH_2}")
      set(_triple "")
    else()
      list(APPEND _bad "${hooked_def}: unreadable row: ${row}")
      continue()
    endif()
    if(_symbol IN_LIST _gaps)
      list(APPEND _gaps_used "${_symbol}")
    elseif(_triple AND NOT _triple IN_LIST _api_triples)
      list(APPEND _bad "${hooked_def}: ${row} has no matching row (base, symbol, version) in ${api_def}")
    elseif(NOT _symbol IN_LIST _api_symbols)
      list(APPEND _bad "${hooked_def}: ${row} names no entry point of ${api_def}")
    endif()
  endforeach()
  file(STRINGS "${used_def}" _used_rows REGEX "^VLAKE_USED\\(")
  foreach(row IN LISTS _used_rows)
    if(row MATCHES "^VLAKE_USED\\(([A-Za-z0-9_]+)\\)")
      if(CMAKE_MATCH_1 IN_LIST _gaps)
        list(APPEND _gaps_used "${CMAKE_MATCH_1}")
      elseif(NOT CMAKE_MATCH_1 IN_LIST _api_symbols)
        list(APPEND _bad "${used_def}: ${row} names no entry point of ${api_def}")
      endif()
    else()
      list(APPEND _bad "${used_def}: unreadable row: ${row}")
    endif()
  endforeach()
  foreach(gap IN LISTS _gaps)
    if(gap IN_LIST _api_symbols)
      list(APPEND _bad "${gaps_file}: ${gap} is in ${api_def} now: remove it from the list")
    elseif(NOT gap IN_LIST _gaps_used)
      list(APPEND _bad "${gaps_file}: no row names ${gap}: remove it from the list")
    endif()
  endforeach()
  if(_bad)
    list(JOIN _bad "\n  " _text)
    message(FATAL_ERROR "The hook's entry-point lists name entry points the driver API list lacks:\n  ${_text}")
  endif()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE AND CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  vlake_check_def_subset("${VLAKE_API_DEF}" "${VLAKE_HOOKED_DEF}" "${VLAKE_USED_DEF}" "${VLAKE_GAPS}")
endif()
