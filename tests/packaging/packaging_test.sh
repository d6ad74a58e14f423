#!/usr/bin/env bash
# Packaging tests (label packaging; tests/packaging/CMakeLists.txt), one case per run:
#
#   packaging_test.sh CASE --build DIR --source DIR --vlaked FILE --vlakectl FILE --bindir DIR
#                          --hookdir DIR --sysconfdir DIR --unitdir DIR --plugin 0|1
#
# --build is the build tree, --vlaked/--vlakectl its programs; the four directories are where
# the configured install puts things (/usr/bin, /usr/lib/vlake, /etc, /usr/lib/systemd/system).
#
#   install  `cmake --install` into a scratch DESTDIR: exactly the expected files with their
#            modes; the programs run; python/vlake imports; the unit names the installed paths;
#            a second install keeps an edited /etc/vlake/vlake.yaml
#   deb      cpack builds the .deb from the built tree (nothing rebuilt); its control fields,
#            computed Depends, conffiles and file list; dpkg installs it into a scratch root
#            (maintainer scripts run there), vlaked and vlakectl run from it, a reinstall keeps an
#            edited conffile, remove keeps the conffiles and warns about the hook left in
#            /etc/ld.so.preload, purge removes the conffiles and the enable link
#   unit     systemd-analyze verify accepts packaging/vlaked.service (any warning fails; broken
#            copies are shown to fail), and vlaked accepts the unit's command line
#   quota    vlakectl quota check accepts packaging/vlake.yaml as shipped and with its example
#            uncommented
#
# Exit 77 (skipped) only when a tool the case needs is absent: dpkg-deb, dpkg-shlibdeps (package
# dpkg-dev) or dpkg for `deb`, systemd-analyze (package systemd) for `unit`. Every case works in
# its own temporary directory and removes it.
set -euo pipefail

case_name="${1:-}"
shift || true
build="" source="" vlaked="" vlakectl="" bindir="" hookdir="" sysconfdir="" unitdir="" plugin=0
while (($#)); do
  case "$1" in
    --build) build="$2" ;;
    --source) source="$2" ;;
    --vlaked) vlaked="$2" ;;
    --vlakectl) vlakectl="$2" ;;
    --bindir) bindir="$2" ;;
    --hookdir) hookdir="$2" ;;
    --sysconfdir) sysconfdir="$2" ;;
    --unitdir) unitdir="$2" ;;
    --plugin) plugin="$2" ;;
    *) echo "packaging_test.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
for v in build source vlaked vlakectl bindir hookdir sysconfdir unitdir; do
  [[ -n "${!v}" ]] || { echo "packaging_test.sh: --$v is required" >&2; exit 2; }
done

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
ok() { echo "ok: $*"; }

work="$(mktemp -d "${TMPDIR:-/tmp}/vlake-packaging-$case_name.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# The files the package and `cmake --install` must hold, absolute, sorted.
expected_files() {
  {
    echo "$bindir/vlaked"
    echo "$bindir/vlakectl"
    if [[ "$plugin" == 1 ]]; then echo "$bindir/vlake-device-plugin"; echo "$bindir/vlake-events"; fi
    echo "$hookdir/libvlake-hook.so"
    for f in "$source"/python/vlake/*.py; do echo "$hookdir/python/vlake/$(basename "$f")"; done
    echo "$unitdir/vlaked.service"
    echo "$sysconfdir/vlake/vlake.yaml"
    echo "$sysconfdir/default/vlaked"
  } | LC_ALL=C sort
}

# Every regular file and link under ROOT, as absolute paths inside it, sorted.
files_under() { (cd "$1" && find . \( -type f -o -type l \) | sed 's|^\.||' | LC_ALL=C sort); }

same_list() {  # same_list WHAT EXPECTED ACTUAL
  if [[ "$2" != "$3" ]]; then
    diff <(echo "$2") <(echo "$3") >&2 || true
    fail "$1: file list differs from the expected one (< expected, > actual)"
  fi
}

mode_of() { stat -c '%a' "$1"; }

# The checks an installed tree (from cmake --install or dpkg) must pass.
check_tree() {  # check_tree ROOT WHAT
  local root="$1" what="$2" f
  for f in "$bindir/vlaked" "$bindir/vlakectl"; do
    [[ "$(mode_of "$root$f")" == 755 ]] || fail "$what: $f has mode $(mode_of "$root$f"), not 755"
  done
  # Shared libraries are not executable (Debian policy); preloading needs only read access.
  for f in "$hookdir/libvlake-hook.so" "$sysconfdir/vlake/vlake.yaml" "$sysconfdir/default/vlaked" \
           "$unitdir/vlaked.service"; do
    [[ "$(mode_of "$root$f")" == 644 ]] || fail "$what: $f has mode $(mode_of "$root$f"), not 644"
  done
  [[ "$(head -c 4 "$root$hookdir/libvlake-hook.so" | od -An -c | tr -d ' ')" == '177ELF' ]] ||
    fail "$what: $hookdir/libvlake-hook.so is not an ELF file"
  "$root$bindir/vlaked" --help >"$work/help.txt" || fail "$what: vlaked --help failed"
  grep -q -- '--config FILE' "$work/help.txt" || fail "$what: vlaked --help does not list --config"
  "$root$bindir/vlakectl" --help >/dev/null || fail "$what: vlakectl --help failed"
  if [[ "$plugin" == 1 ]]; then
    "$root$bindir/vlake-device-plugin" --help >/dev/null || fail "$what: vlake-device-plugin --help failed"
    "$root$bindir/vlake-events" --help >/dev/null || fail "$what: vlake-events --help failed"
  fi
  "$root$bindir/vlakectl" quota check "$root$sysconfdir/vlake/vlake.yaml" >/dev/null ||
    fail "$what: vlakectl quota check rejects the installed $sysconfdir/vlake/vlake.yaml"
  grep -qx "ExecStart=$bindir/vlaked --config $sysconfdir/vlake/vlake.yaml \$VLAKED_ARGS" \
    "$root$unitdir/vlaked.service" || fail "$what: the unit's ExecStart does not name $bindir/vlaked and the quota file"
  grep -qx "EnvironmentFile=-$sysconfdir/default/vlaked" "$root$unitdir/vlaked.service" ||
    fail "$what: the unit does not read $sysconfdir/default/vlaked"
  grep -qx 'VLAKED_ARGS=""' "$root$sysconfdir/default/vlaked" || fail "$what: $sysconfdir/default/vlaked sets no VLAKED_ARGS"
  if command -v python3 >/dev/null; then
    PYTHONPATH="$root$hookdir/python" python3 -c "import vlake, sys; assert vlake.__file__.startswith('$root'); assert not vlake.available()" ||
      fail "$what: python/vlake does not import from $hookdir/python"
  fi
  ok "$what: modes, programs, quota file, unit paths, python/vlake"
}

case "$case_name" in
  install)
    root="$work/root"
    DESTDIR="$root" cmake --install "$build" >"$work/install.log" || { cat "$work/install.log" >&2; fail "cmake --install failed"; }
    same_list "cmake --install" "$(expected_files)" "$(files_under "$root")"
    ok "cmake --install: $(expected_files | wc -l) files, as expected"
    check_tree "$root" "cmake --install"
    # An operator's quota file and flags survive a second install.
    echo "# edited by the operator" >>"$root$sysconfdir/vlake/vlake.yaml"
    echo 'VLAKED_ARGS="--log-level debug"' >"$root$sysconfdir/default/vlaked"
    DESTDIR="$root" cmake --install "$build" >"$work/install2.log" || { cat "$work/install2.log" >&2; fail "second cmake --install failed"; }
    grep -q '^# edited by the operator$' "$root$sysconfdir/vlake/vlake.yaml" || fail "a second install replaced vlake.yaml"
    grep -q 'log-level debug' "$root$sysconfdir/default/vlaked" || fail "a second install replaced $sysconfdir/default/vlaked"
    grep -q "Keeping: $root$sysconfdir/vlake/vlake.yaml" "$work/install2.log" || fail "the second install does not say it kept vlake.yaml"
    ok "a second cmake --install keeps the edited configuration files"
    ;;

  deb)
    for tool in dpkg dpkg-deb dpkg-shlibdeps cpack; do
      command -v "$tool" >/dev/null || skip "$tool not found (scripts/setup.sh installs dpkg-dev)"
    done
    [[ -f "$build/CPackConfig.cmake" ]] || fail "$build has no CPackConfig.cmake"
    # The tree is built: cpack only installs it into its staging directory and packs it.
    (cd "$work" && cpack --config "$build/CPackConfig.cmake" -G DEB -B "$work/out") >"$work/cpack.log" 2>&1 ||
      { cat "$work/cpack.log" >&2; fail "cpack -G DEB failed"; }
    if grep -q 'preinstall' "$work/cpack.log"; then
      cat "$work/cpack.log" >&2
      fail "cpack ran the preinstall build (CMAKE_SKIP_INSTALL_ALL_DEPENDENCY lost?)"
    fi
    debs=("$work"/out/vlake_*.deb)
    [[ ${#debs[@]} == 1 && -f "${debs[0]}" ]] || { cat "$work/cpack.log" >&2; fail "cpack made no vlake_*.deb"; }
    deb="${debs[0]}"
    version="$(sed -n 's/^project(vlake VERSION \([0-9.]*\).*/\1/p' "$source/CMakeLists.txt")"
    [[ "$(basename "$deb")" == "vlake_${version}_$(dpkg --print-architecture).deb" ]] ||
      fail "package file $(basename "$deb"), expected vlake_${version}_$(dpkg --print-architecture).deb"
    [[ "$(dpkg-deb -f "$deb" Package)" == vlake ]] || fail "Package is not vlake"
    [[ "$(dpkg-deb -f "$deb" Version)" == "$version" ]] || fail "Version is not $version"
    depends="$(dpkg-deb -f "$deb" Depends)"
    for lib in libc6 libstdc++6 libyaml-cpp; do
      [[ "$depends" == *"$lib"* ]] || fail "Depends ($depends) names no $lib: not computed by dpkg-shlibdeps?"
    done
    [[ -n "$(dpkg-deb -f "$deb" Maintainer)" ]] || fail "no Maintainer"
    ok "$(basename "$deb"): Package vlake, Version $version, Depends: $depends"

    dpkg-deb -e "$deb" "$work/control"
    printf '%s\n%s\n' "$sysconfdir/vlake/vlake.yaml" "$sysconfdir/default/vlaked" >"$work/conffiles.expected"
    diff "$work/conffiles.expected" "$work/control/conffiles" >&2 || fail "conffiles differ from the expected ones"
    for s in postinst prerm postrm; do
      [[ -x "$work/control/$s" ]] || fail "the package has no executable $s"
      sh -n "$work/control/$s" || fail "$s is not valid sh"
    done
    contents="$(dpkg-deb --fsys-tarfile "$deb" | tar -t | sed -n 's|^\./|/|; /[^/]$/p' | LC_ALL=C sort)"
    same_list "the .deb" "$(expected_files)" "$contents"
    ok "conffiles, maintainer scripts, $(echo "$contents" | wc -l) files as expected"

    # Install into a scratch root: its own dpkg database; maintainer scripts run outside a
    # chroot with DPKG_ROOT set; the libraries it depends on live on this machine, not there.
    root="$work/root"
    mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers"
    touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
    dpkg_root() {
      dpkg --root="$root" --log=/dev/null --force-not-root --force-script-chrootless --force-depends \
        --force-unsafe-io "$@"
    }
    dpkg_root -i "$deb" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; fail "dpkg -i into the scratch root failed"; }
    [[ "$(dpkg_root -s vlake 2>/dev/null | sed -n 's/^Status: //p')" == "install ok installed" ]] ||
      { cat "$work/dpkg.log" >&2; fail "vlake is not 'install ok installed' in the scratch root"; }
    installed="$(files_under "$root" | grep -v '^/var/lib/dpkg/')"
    same_list "dpkg -i" "$(expected_files)" "$installed"
    check_tree "$root" "dpkg -i"

    # An edited conffile survives a reinstall (postinst runs as for an upgrade).
    echo "# edited by the operator" >>"$root$sysconfdir/vlake/vlake.yaml"
    dpkg_root --force-confold -i "$deb" >"$work/dpkg2.log" 2>&1 || { cat "$work/dpkg2.log" >&2; fail "reinstalling failed"; }
    grep -q '^# edited by the operator$' "$root$sysconfdir/vlake/vlake.yaml" || fail "a reinstall replaced the edited vlake.yaml"
    ok "a reinstall keeps the edited quota file"

    # Remove keeps the conffiles (and warns about a hook left in /etc/ld.so.preload); purge
    # removes them and the link `systemctl enable` makes.
    echo "$hookdir/libvlake-hook.so" >"$root/etc/ld.so.preload"
    dpkg_root -r vlake >"$work/dpkg3.log" 2>&1 || { cat "$work/dpkg3.log" >&2; fail "dpkg -r failed"; }
    grep -q 'ld.so.preload names libvlake-hook.so' "$work/dpkg3.log" ||
      { cat "$work/dpkg3.log" >&2; fail "dpkg -r did not warn about the hook in /etc/ld.so.preload"; }
    rm "$root/etc/ld.so.preload"
    [[ ! -e "$root$bindir/vlaked" && ! -e "$root$hookdir/libvlake-hook.so" ]] || fail "dpkg -r left the programs"
    [[ -f "$root$sysconfdir/vlake/vlake.yaml" && -f "$root$sysconfdir/default/vlaked" ]] || fail "dpkg -r removed the conffiles"
    mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
    ln -s "$unitdir/vlaked.service" "$root/etc/systemd/system/multi-user.target.wants/vlaked.service"
    dpkg_root -P vlake >"$work/dpkg4.log" 2>&1 || { cat "$work/dpkg4.log" >&2; fail "dpkg -P failed"; }
    [[ ! -e "$root$sysconfdir/vlake/vlake.yaml" && ! -e "$root$sysconfdir/default/vlaked" ]] || fail "dpkg -P left the conffiles"
    [[ ! -L "$root/etc/systemd/system/multi-user.target.wants/vlaked.service" ]] || fail "purge left the enable link"
    left="$(files_under "$root" | grep -v '^/var/lib/dpkg/' || true)"
    [[ -z "$left" ]] || fail "files left after purge: $left"
    ok "remove keeps the conffiles; purge removes them and the enable link"
    ;;

  unit)
    command -v systemd-analyze >/dev/null || skip "systemd-analyze not found (package systemd)"
    unit="$source/packaging/vlaked.service"
    exec_line="$(grep '^ExecStart=' "$unit")"
    [[ "$exec_line" == 'ExecStart=/usr/bin/vlaked --config /etc/vlake/vlake.yaml $VLAKED_ARGS' ]] ||
      fail "unexpected $exec_line"
    # verify checks that the command exists: a copy runs the built vlaked instead of /usr/bin's.
    verify() {  # verify UNIT_FILE: prints what systemd-analyze said; status 0 only when silent
      local out rc=0
      out="$(systemd-analyze verify --man=no "$1" 2>&1)" || rc=$?
      printf '%s' "$out"
      [[ $rc == 0 && -z "$out" ]]
    }
    mkdir "$work/good"
    sed "s|^ExecStart=/usr/bin/vlaked |ExecStart=$vlaked |" "$unit" >"$work/good/vlaked.service"
    grep -q "^ExecStart=$vlaked " "$work/good/vlaked.service" || fail "could not point the copy at $vlaked"
    out="$(verify "$work/good/vlaked.service")" || fail "systemd-analyze verify: $out"
    ok "systemd-analyze verify accepts vlaked.service"
    # The same check fails on a misspelled key, a bad value and a missing program.
    n=0
    for edit in 's/^ProtectSystem=strict/ProtectSystm=strict/' 's/^Restart=on-failure/Restart=sometimes/' \
                "s|^ExecStart=$vlaked |ExecStart=$work/missing/vlaked |"; do
      n=$((n + 1))
      mkdir "$work/bad$n"
      sed "$edit" "$work/good/vlaked.service" >"$work/bad$n/vlaked.service"
      ! cmp -s "$work/good/vlaked.service" "$work/bad$n/vlaked.service" || fail "edit $edit changed nothing"
      if verify "$work/bad$n/vlaked.service" >/dev/null; then fail "systemd-analyze verify accepted a unit with $edit"; fi
    done
    ok "systemd-analyze verify rejects a misspelled key, a bad value, a missing program"
    # vlaked accepts the command line the unit runs (VLAKED_ARGS empty, as shipped).
    "$vlaked" --config /etc/vlake/vlake.yaml --help >/dev/null || fail "vlaked rejects the unit's command line"
    for key in Type=exec Restart=on-failure ProtectSystem=strict ProtectHome=yes PrivateTmp=yes NoNewPrivileges=yes \
               RuntimeDirectory=vlake RuntimeDirectoryMode=0755 RuntimeDirectoryPreserve=yes WantedBy=multi-user.target; do
      grep -qx "$key" "$unit" || fail "vlaked.service lacks $key"
    done
    # The state segment lives in /run/vlake/state (root's), not in /dev/shm where anyone creates names.
    if grep -q '/dev/shm' "$unit"; then fail "vlaked.service still gives vlaked /dev/shm for its state segment"; fi
    if grep -Eq '^(PrivateDevices=yes|DevicePolicy=|DeviceAllow=|ProtectClock=yes)' "$unit"; then
      fail "vlaked.service restricts devices: the GPU's /dev/nvidia* would be hidden"
    fi
    ok "vlaked accepts the unit's command line; hardening present, devices not restricted"
    ;;

  quota)
    sample="$source/packaging/vlake.yaml"
    "$vlakectl" quota check "$sample" || fail "vlakectl quota check rejects packaging/vlake.yaml"
    # The commented example: lines starting with '#' followed by a non-space, or by two spaces.
    sed -E 's/^#([^ #]|  )/\1/' "$sample" >"$work/example.yaml"
    grep -q '^namespaces:$' "$work/example.yaml" || fail "uncommenting found no namespaces: section"
    grep -q '^users:$' "$work/example.yaml" && grep -q '^groups:$' "$work/example.yaml" ||
      fail "uncommenting found no users: or groups: section"
    "$vlakectl" quota check "$work/example.yaml" --gpu-memory 80GiB ||
      fail "vlakectl quota check rejects the uncommented example of packaging/vlake.yaml"
    ok "packaging/vlake.yaml and its uncommented example are valid quota files"
    ;;

  *)
    echo "usage: packaging_test.sh install|deb|unit|quota --build DIR --source DIR ..." >&2
    exit 2
    ;;
esac
