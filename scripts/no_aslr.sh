# Sourced by scripts/sanitizers.sh and scripts/fuzz.sh. The sanitizer runtimes of this toolchain
# cannot map their shadow memory when the kernel randomizes mmap with more than 28 bits
# (vm.mmap_rnd_bits = 32 on some recent kernels).
#
# no_aslr_runner NAME WHAT: sets the array `runner` to a command prefix that runs a program with
# address-space randomization off where that is needed and the kernel allows it (empty where it
# is not needed); where it is needed but not allowed, warns on stderr that WHAT may fail.
no_aslr_runner() {
  runner=()
  if [[ -r /proc/sys/vm/mmap_rnd_bits && "$(cat /proc/sys/vm/mmap_rnd_bits)" -gt 28 ]]; then
    if setarch "$(uname -m)" -R true 2>/dev/null; then
      runner=(setarch "$(uname -m)" -R)
    else
      echo "$1: vm.mmap_rnd_bits > 28 and setarch -R is not allowed; $2 may fail" >&2
    fi
  fi
}
