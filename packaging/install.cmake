# What `cmake --install` installs and how CPack packs it into one Debian package, `vlake`
# (docs/workstation.md). Included by the top-level CMakeLists.txt after every component, so the
# targets named here exist. Every install rule and all CPack settings of the project live here.
#
# Layout with prefix /usr (the presets set it, and it is the default here; its sysconfdir is /etc):
#   /usr/bin/vlaked, /usr/bin/vlakectl; /usr/bin/vlake-device-plugin, /usr/bin/vlake-events (when built)
#   /usr/lib/vlake/libvlake-hook.so          the one hook path (hosts, the package, the image)
#   /usr/lib/vlake/python/vlake/             python/vlake (PYTHONPATH=/usr/lib/vlake/python)
#   /usr/lib/systemd/system/vlaked.service   packaging/vlaked.service
#   /etc/vlake/vlake.yaml                    packaging/vlake.yaml, the sample quota file
#   /etc/default/vlaked                      packaging/vlaked.default: VLAKED_ARGS, vlaked's flags
#
# Components: `runtime` (binaries, hook, Python module; what the container image takes with
# `cmake --install --component runtime`) and `host` (the systemd unit and the two files in
# /etc). The package holds both. `cmake --install` never replaces an existing /etc/vlake/vlake.yaml
# or /etc/default/vlaked (the package marks them as conffiles, so dpkg asks instead).
#
# `cmake --build <dir> --target package` builds `all`, then packs. `cpack` in a built tree packs
# without building anything (CMAKE_SKIP_INSTALL_ALL_DEPENDENCY: installing builds nothing, so
# cpack's install step does not build `all`, the tests and benchmarks included); the packaging
# tests rely on that.
include(GNUInstallDirs)

if(CMAKE_INSTALL_PREFIX_INITIALIZED_TO_DEFAULT)
  set(CMAKE_INSTALL_PREFIX "/usr" CACHE PATH "Install prefix (/usr: the paths of docs/workstation.md)" FORCE)
endif()
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)

set(VLAKE_INSTALL_BINDIR "${CMAKE_INSTALL_PREFIX}/bin")
set(VLAKE_INSTALL_HOOKDIR "${CMAKE_INSTALL_PREFIX}/lib/vlake")
# GNUInstallDirs maps the sysconfdir of prefix /usr to /etc (and of /usr/local to /usr/local/etc).
set(VLAKE_INSTALL_SYSCONFDIR "${CMAKE_INSTALL_FULL_SYSCONFDIR}")
set(VLAKE_INSTALL_UNITDIR "${CMAKE_INSTALL_PREFIX}/lib/systemd/system")

set(_vlake_programs vlaked vlakectl)
if(TARGET vlake-device-plugin)
  list(APPEND _vlake_programs vlake-device-plugin vlake-events)
endif()
install(TARGETS ${_vlake_programs} RUNTIME DESTINATION "${VLAKE_INSTALL_BINDIR}" COMPONENT runtime)
# The hook is dlopen'ed by path (LD_PRELOAD, /etc/ld.so.preload, the device plugin's mount), not
# found through the linker's search path: no SONAME, no ldconfig.
install(TARGETS vlake_hook LIBRARY DESTINATION "${VLAKE_INSTALL_HOOKDIR}" COMPONENT runtime)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/python/vlake" DESTINATION "${VLAKE_INSTALL_HOOKDIR}/python"
        COMPONENT runtime FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)

# The unit names its paths literally (/usr/bin/vlaked, /etc/vlake/vlake.yaml, /etc/default/vlaked);
# another prefix gets a copy with those replaced (/etc/ld.so.preload stays).
file(READ "${CMAKE_CURRENT_LIST_DIR}/vlaked.service" _vlake_unit)
string(REPLACE "/usr/bin/vlaked" "${VLAKE_INSTALL_BINDIR}/vlaked" _vlake_unit "${_vlake_unit}")
string(REPLACE "/etc/vlake/" "${VLAKE_INSTALL_SYSCONFDIR}/vlake/" _vlake_unit "${_vlake_unit}")
string(REPLACE "/etc/default/vlaked" "${VLAKE_INSTALL_SYSCONFDIR}/default/vlaked" _vlake_unit "${_vlake_unit}")
file(CONFIGURE OUTPUT "${PROJECT_BINARY_DIR}/packaging/vlaked.service" CONTENT "${_vlake_unit}" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/packaging/vlaked.service" DESTINATION "${VLAKE_INSTALL_UNITDIR}"
        COMPONENT host)

# Configuration files: installed only where none exists yet (file(INSTALL) adds DESTDIR itself).
foreach(pair "vlake.yaml|${VLAKE_INSTALL_SYSCONFDIR}/vlake|vlake.yaml"
             "vlaked.default|${VLAKE_INSTALL_SYSCONFDIR}/default|vlaked")
  string(REPLACE "|" ";" pair "${pair}")
  list(GET pair 0 _src)
  list(GET pair 1 _dir)
  list(GET pair 2 _name)
  install(CODE "
    if(EXISTS \"\$ENV{DESTDIR}${_dir}/${_name}\")
      message(STATUS \"Keeping: \$ENV{DESTDIR}${_dir}/${_name} (exists; the sample is ${CMAKE_CURRENT_LIST_DIR}/${_src})\")
    else()
      file(INSTALL DESTINATION \"${_dir}\" TYPE FILE PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
           RENAME \"${_name}\" FILES \"${CMAKE_CURRENT_LIST_DIR}/${_src}\")
    endif()" COMPONENT host)
endforeach()

# ---- CPack: one Debian package, `vlake`.
set(VLAKE_PACKAGE_MAINTAINER "vlake <dev@vlake.io>" CACHE STRING "Maintainer field of the Debian package")
set(CPACK_GENERATOR "DEB")
set(CPACK_SOURCE_GENERATOR "TGZ")
set(CPACK_PACKAGE_NAME "vlake")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_CONTACT "${VLAKE_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "multi-tenant GPU memory virtualization")
set(CPACK_PACKAGE_DESCRIPTION
    "Several users, notebooks or containers share one GPU, each with a memory quota enforced at run time.\n"
    "A hook library preloaded into tenant processes (/usr/lib/vlake/libvlake-hook.so) forwards CUDA\n"
    "allocations to the node daemon vlaked (vlaked.service), which owns the GPU's memory.\n"
    "vlakectl shows who holds what. Quotas: /etc/vlake/vlake.yaml.")
string(JOIN "" CPACK_PACKAGE_DESCRIPTION ${CPACK_PACKAGE_DESCRIPTION})
# Absolute destinations (/etc) need DESTDIR staging; the package then holds the configured prefix.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX "${CMAKE_INSTALL_PREFIX}")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME "DEB-DEFAULT")  # vlake_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION "admin")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)  # Depends: from dpkg-shlibdeps (package dpkg-dev)
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3")
# dpkg keeps an operator's edits of these on upgrade and removes them on purge.
file(CONFIGURE OUTPUT "${PROJECT_BINARY_DIR}/packaging/conffiles"
     CONTENT "${VLAKE_INSTALL_SYSCONFDIR}/vlake/vlake.yaml\n${VLAKE_INSTALL_SYSCONFDIR}/default/vlaked\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA "${PROJECT_BINARY_DIR}/packaging/conffiles" "${CMAKE_CURRENT_LIST_DIR}/deb/postinst"
    "${CMAKE_CURRENT_LIST_DIR}/deb/prerm" "${CMAKE_CURRENT_LIST_DIR}/deb/postrm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_SOURCE_IGNORE_FILES "/\\\\.git/" "/build/" "/\\\\.deps/" "/tools/k8s/node_modules/" "/tools/k8s/bin/")
include(CPack)
