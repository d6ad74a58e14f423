#!/usr/bin/env bash
# vlake in one command: vlaked on the simulated GPU (or on the real one when this machine has
# one), three tenants allocating and freeing GPU memory under their quotas, `vlakectl top`, the
# Prometheus endpoint; then everything is stopped and removed. A few seconds.
#
#   ./scripts/demo.sh                    # after ./scripts/setup.sh (uses build/release)
#   ./scripts/demo.sh --sim              # the simulated GPU even on a machine with a GPU
#   ./scripts/demo.sh --gpu              # the real GPU (libcuda.so.1, NVML)
#   ./scripts/demo.sh --build-dir build/debug
#
# Tenants: as root, three throwaway uids (61001.. upward, the first three that no user has) run
# the tenants under setpriv, each mapped to its own namespace by the quota file, as Unix users of
# a shared workstation are. Not as root, the three tenants run as the calling user and are told
# apart the way Kubernetes pods are: vlaked serves three allocation directories (--alloc-root,
# docs/device-plugin.md), one socket each, each with its pod's namespace.
#
# Exits 0 when every step did what it should (three tenants in `vlakectl top`, their metrics,
# the over-limit allocation refused, everything given back at the end), 1 otherwise. Whatever
# happens, it stops what it started and removes every file it made (a temporary directory
# holding the state segment, the simulator's /dev/shm/vlake-sim-<node>). docs/simulator.md, "Demo".
set -euo pipefail
called_from="$PWD"
cd "$(dirname "$0")/.."

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
mode=auto
build=build/release  # relative to the repository; --build-dir to where it is called from
while (($#)); do
  case "$1" in
    --sim) mode=sim ;;
    --gpu) mode=gpu ;;
    --build-dir)
      [[ $# -ge 2 ]] || { echo "demo.sh: --build-dir needs a directory" >&2; exit 2; }
      build="$2"
      [[ "$build" == /* ]] || build="$called_from/$build"
      shift
      ;;
    -h | --help) usage; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done

# ---- output ------------------------------------------------------------------------------------
bold="" dim="" red="" green="" reset=""
if [[ -t 1 ]]; then bold=$'\e[1m' dim=$'\e[2m' red=$'\e[31m' green=$'\e[32m' reset=$'\e[0m'; fi
section() { printf '\n%s== %s ==%s\n' "$bold" "$*" "$reset"; }
say() { printf '%s\n' "$*"; }
show() { printf '%s$ %s%s\n' "$dim" "$*" "$reset"; }  # a command as the reader would type it
indent() { sed 's/^/    /'; }
fail() {
  printf '%sdemo.sh: FAILED: %s%s\n' "$red" "$*" "$reset" >&2
  exit 1
}

# ---- what it runs -------------------------------------------------------------------------------
vlaked_bin="$build/pool/vlaked"
vlakectl_bin="$build/ctl/vlakectl"
hook_lib="$build/hook/libvlake-hook.so"
tenant_bin="$build/tests/hook/vlake_hook_tenant"  # a CUDA program driven by steps (tests/hook/tenant.cpp)
sim_cuda="$build/sim/libcuda.so.1"
sim_nvml="$build/sim/libnvidia-ml.so.1"
for f in "$vlaked_bin" "$vlakectl_bin" "$hook_lib" "$tenant_bin" "$sim_cuda" "$sim_nvml"; do
  [[ -e "$f" ]] || fail "$f is missing: build the tree first (./scripts/setup.sh, or --build-dir DIR; the tenant program is built with the tests)"
done
command -v python3 >/dev/null || fail "python3 is needed (./scripts/setup.sh installs it)"

if [[ "$mode" == auto ]]; then
  mode=sim
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then mode=gpu; fi
fi
root=0
[[ "$(id -u)" == 0 ]] && root=1
((!root)) || command -v setpriv >/dev/null || fail "setpriv (util-linux) is needed to run tenants as other uids"

# ---- clean-up, whatever happens ------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/vlake-demo.XXXXXX")"
tag="demo-$$"
state="$work/state"      # vlaked's state segment: a file in the private work directory
node="$tag"              # the simulated machine: /dev/shm/vlake-sim-<node>
vlaked_pid=""
tenant_pids=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${tenant_pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${tenant_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ -n "$vlaked_pid" ]] && kill -0 "$vlaked_pid" 2>/dev/null; then
    kill -TERM "$vlaked_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$vlaked_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$vlaked_pid" 2>/dev/null || true
    wait "$vlaked_pid" 2>/dev/null || true
  fi
  if ((rc != 0)) && [[ -s "$work/vlaked.log" ]]; then
    echo "---- vlaked's log (last 30 lines) ----" >&2
    tail -n 30 "$work/vlaked.log" >&2
  fi
  rm -f "$state" "/dev/shm/vlake-sim-$node"
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Everything tenants of other uids use lives in the work directory (mode 0755), so a checkout
# under a private home directory works too.
chmod 0755 "$work"
mkdir -m 0755 "$work/lib" "$work/bin"
mkdir -m 1777 "$work/flags"  # the tenants' "I am at step N" files
cp "$hook_lib" "$work/lib/libvlake-hook.so"
cp "$tenant_bin" "$work/bin/vlake-tenant"
if [[ "$mode" == sim ]]; then cp "$sim_cuda" "$sim_nvml" "$work/lib/"; fi
chmod -R a+rX "$work/lib" "$work/bin"

# ---- the tenants and their quota ------------------------------------------------------------------
names=(research batch notebooks)  # one namespace per tenant
limits=(8 4 2)  # GiB: with room for a CUDA context (about 500 MiB a process on a GPU)
if ((root)); then
  # Three uids and a gid that no user or group has.
  uids=()
  candidate=61001
  while ((${#uids[@]} < 3)); do
    getent passwd "$candidate" >/dev/null || uids+=("$candidate")
    candidate=$((candidate + 1))
  done
  gid=61000
  while getent group "$gid" >/dev/null; do gid=$((gid + 1)); done
  {
    echo "version: 1"
    echo "default:"
    echo "  limit: 1GiB"
    echo "namespaces:"
    for i in 0 1 2; do
      printf '  - name: %s\n    limit: %sGiB\n    users: [%s]\n' "${names[$i]}" "${limits[$i]}" "${uids[$i]}"
    done
  } >"$work/vlake.yaml"
  tenants=("research/user:${uids[0]}" "batch/user:${uids[1]}" "notebooks/user:${uids[2]}")
else
  {
    echo "version: 1"
    echo "default:"
    echo "  limit: 1GiB"
    echo "namespaces:"
    for i in 0 1 2; do printf '  - name: %s\n    limit: %sGiB\n' "${names[$i]}" "${limits[$i]}"; done
  } >"$work/vlake.yaml"
  pods=(train-0 etl-0 jupyter-alice)
  tenants=("pod:research/train-0/main" "pod:batch/etl-0/main" "pod:notebooks/jupyter-alice/main")
fi

section "vlake demo"
if [[ "$mode" == sim ]]; then
  say "GPU:      simulated, 16 GiB (sim/libcuda.so.1; no GPU needed)"
else
  say "GPU:      this machine's (libcuda.so.1): $(nvidia-smi -L 2>/dev/null | head -n 1 || true)"
fi
if ((root)); then
  say "tenants:  three Unix users (uids ${uids[*]}, throwaway), one namespace each"
else
  say "tenants:  three pods' allocations, all running as $(id -un 2>/dev/null || id -u) (not root: no other uids)"
fi
say "files:    $work, $state$([[ "$mode" == sim ]] && echo ", /dev/shm/vlake-sim-$node")"
say "quota file ($work/vlake.yaml):"
indent <"$work/vlake.yaml"
show "vlakectl quota check $work/vlake.yaml"
"$vlakectl_bin" quota check "$work/vlake.yaml" | indent || fail "the quota file is not valid"

# ---- vlaked ---------------------------------------------------------------------------------------
section "1. start vlaked"
export VLAKE_SIM_NODE="$node" VLAKE_SIM_DEVICE_MEMORY=16GiB
# vlaked creates the simulated node file; the tenants (gid $gid) must open it read-write.
((root)) && export VLAKE_SIM_NODE_GROUP="$gid"
sock="$work/vlaked.sock"
args=(--config "$work/vlake.yaml" --socket "$sock" --state "$state" --sample-interval-ms 250)
if [[ "$mode" == sim ]]; then args+=(--driver "$work/lib/libcuda.so.1" --nvml "$work/lib/libnvidia-ml.so.1"); fi
((root)) || args+=(--alloc-root "$work/alloc")
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
for attempt in 1 2 3; do  # a free port found now may be taken before vlaked binds it: try again
  port="$(free_port)"
  metrics="http://127.0.0.1:$port/metrics"
  show "vlaked ${args[*]} --metrics-address 127.0.0.1:$port &"
  "$vlaked_bin" "${args[@]}" --metrics-address "127.0.0.1:$port" >"$work/vlaked.log" 2>&1 &
  vlaked_pid=$!
  for _ in $(seq 150); do
    [[ -S "$sock" ]] && grep -q "metrics on" "$work/vlaked.log" && break
    kill -0 "$vlaked_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -S "$sock" ]] && kill -0 "$vlaked_pid" 2>/dev/null; then break; fi
  wait "$vlaked_pid" 2>/dev/null || true
  vlaked_pid=""
  grep -q "cannot listen" "$work/vlaked.log" && ((attempt < 3)) && continue
  fail "vlaked did not start (its log follows)"
done
say "vlaked pid $vlaked_pid is up: socket $sock, metrics $metrics"
ctl() { "$vlakectl_bin" --state "$state" "$@"; }

if ((!root)); then
  # What vlake-device-plugin does on Kubernetes: one allocation directory per container, with its
  # GPU, its size (the tenant's limit) and, once known, its pod (docs/device-plugin.md).
  uuid="$(ctl pool --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["gpus"][0]["uuid"])')"
  allocs=()
  for i in 0 1 2; do
    id="$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
    dir="$work/alloc/$id"
    mkdir -p "$dir"
    bytes=$((limits[i] << 30))
    printf 'version=1\nid=%s\ngpu_uuid=%s\ndevice_ids=%s::0\nbytes=%s\ncreated=%s\n' \
      "$id" "$uuid" "$uuid" "$bytes" "$(date +%s)" >"$dir/.allocation.tmp"
    mv "$dir/.allocation.tmp" "$dir/allocation"
    printf 'version=1\nnamespace=%s\npod=%s\ncontainer=main\n' "${names[$i]}" "${pods[$i]}" >"$dir/.owner.tmp"
    mv "$dir/.owner.tmp" "$dir/owner"
    allocs+=("$dir")
  done
  for dir in "${allocs[@]}"; do
    for _ in $(seq 100); do [[ -S "$dir/vlaked.sock" ]] && break; sleep 0.1; done
    [[ -S "$dir/vlaked.sock" ]] || fail "vlaked did not open a socket in $dir"
  done
  say "three allocation directories under $work/alloc, one socket each"
fi

# ---- the tenants ----------------------------------------------------------------------------------
# Each tenant: allocate (phase 1), free one buffer and allocate another (phase 2; notebooks also
# asks for more than its 2 GiB limit and is refused), free everything (phase 3), exit.
steps=(
  "init info alloc:a:2G alloc:b:1G touch:F/0.1 waitfile:F/go.2 free:b alloc:c:1536M touch:F/0.2 waitfile:F/go.3 free:a free:c touch:F/0.3"
  "init info alloc:a:1G alloc:b:512M touch:F/1.1 waitfile:F/go.2 free:a alloc:c:1G touch:F/1.2 waitfile:F/go.3 free:b free:c touch:F/1.3"
  "init info alloc:a:512M touch:F/2.1 waitfile:F/go.2 alloc:big:4G alloc:c:512M touch:F/2.2 waitfile:F/go.3 free:a free:c touch:F/2.3"
)
refused_step="alloc:big:4G"  # notebooks' limit is 2 GiB

section "2. three tenants allocate GPU memory"
for i in 0 1 2; do
  env_args=(LD_PRELOAD="$work/lib/libvlake-hook.so" VLAKE_SOCKET="$sock")
  ((root)) || env_args[1]="VLAKE_SOCKET=${allocs[$i]}/vlaked.sock"
  if [[ "$mode" == sim ]]; then
    env_args+=(LD_LIBRARY_PATH="$work/lib" VLAKE_SIM_NODE="$node" VLAKE_SIM_DEVICE_MEMORY=16GiB)
  fi
  read -r -a tenant_steps <<<"${steps[$i]//F\//$work/flags/}"
  if ((root)); then
    setpriv --reuid="${uids[$i]}" --regid="$gid" --clear-groups -- \
      env "${env_args[@]}" "$work/bin/vlake-tenant" "${tenant_steps[@]}" >"$work/tenant-$i.log" 2>&1 &
    who="uid ${uids[$i]}"
  else
    env "${env_args[@]}" "$work/bin/vlake-tenant" "${tenant_steps[@]}" >"$work/tenant-$i.log" 2>&1 &
    who="pod ${names[$i]}/${pods[$i]}"
  fi
  tenant_pids+=($!)
  say "${tenants[$i]}: pid $! ($who), LD_PRELOAD=libvlake-hook.so: ${steps[$i]%% touch:*}"
done

# wait_phase N: every tenant has reached the end of phase N (its flag file exists).
wait_phase() {
  local i
  for _ in $(seq 300); do
    local done_count=0
    for i in 0 1 2; do [[ -e "$work/flags/$i.$1" ]] && done_count=$((done_count + 1)); done
    ((done_count == 3)) && return 0
    for i in 0 1 2; do
      if ! kill -0 "${tenant_pids[$i]}" 2>/dev/null; then
        indent <"$work/tenant-$i.log" >&2
        fail "tenant ${tenants[$i]} exited before the end of phase $1"
      fi
    done
    sleep 0.1
  done
  for i in 0 1 2; do indent <"$work/tenant-$i.log" >&2; done
  fail "the tenants did not reach the end of phase $1 within 30 s"
}
wait_phase 1
for i in 0 1 2; do
  total="$(sed -n 's/^info rc=0 .*total=\([0-9]*\).*/\1/p' "$work/tenant-$i.log")"
  [[ -n "$total" ]] || fail "tenant ${tenants[$i]}: cuMemGetInfo failed"
  say "${tenants[$i]} sees a GPU of $((total >> 20)) MiB (cuMemGetInfo: its limit, not the whole card)"
done

# check_top: `vlakectl top --json` lists the three tenants with memory on GPU 0.
check_top() {
  ctl top --json >"$work/top.json" || fail "vlakectl top --json failed"
  python3 - "$work/top.json" "${tenants[@]}" <<'PY' || fail "vlakectl top does not show the three tenants"
import json, sys
top = json.load(open(sys.argv[1]))
held = {t["name"]: t["used"] for t in top["gpus"][0]["tenants"]}
missing = [name for name in sys.argv[2:] if held.get(name, 0) <= 0]
if missing:
    print("not holding memory in vlakectl top: " + ", ".join(missing), file=sys.stderr)
    sys.exit(1)
PY
}

section "3. vlakectl top: who holds what"
show "vlakectl --state $state top"
ctl top | indent
check_top

section "4. tenants free and allocate again; one asks for more than its limit"
touch "$work/flags/go.2"
wait_phase 2
grep -h "^$refused_step " "$work/tenant-2.log" | sed "s|^|${tenants[2]}: |" | indent
grep -q "^$refused_step rc=2 " "$work/tenant-2.log" ||
  fail "${tenants[2]}: $refused_step should fail with CUDA_ERROR_OUT_OF_MEMORY (rc=2)"
say "(rc=2 is CUDA_ERROR_OUT_OF_MEMORY: the allocation would take the tenant past its ${limits[2]} GiB limit)"
show "vlakectl --state $state events"
ctl events | indent
ctl events --json | python3 -c '
import json, sys
r = json.load(sys.stdin)["refusals"]
sys.exit(0 if any(x["reason"] == "tenant_limit" and x["tenant"] == sys.argv[1] for x in r) else 1)' "${tenants[2]}" ||
  fail "vlakectl events should list the refusal of ${tenants[2]} (reason tenant_limit)"
show "vlakectl --state $state top"
ctl top | indent
check_top
say "(What the tenants freed is back in vlaked's pool, the GPU line's 'free', for their next"
say " allocations; small frees stay mapped in the process, its local reserve: docs/hook.md.)"
if [[ "$mode" == gpu ]]; then
  say "(On a GPU, USED also counts each process's CUDA context, about 500 MiB, which NVML reports:"
  say " non-pool memory, docs/daemon.md.)"
fi

section "5. Prometheus metrics"
fetch() {
  if command -v curl >/dev/null; then
    curl -sf --max-time 5 "$1"
  else
    python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"
  fi
}
show "curl -s $metrics | grep -E '^vlake_(tenant_used_bytes|tenant_limit_bytes|grant_denials_total)'"
fetch "$metrics" >"$work/metrics.txt" || fail "GET $metrics failed"
grep -E '^vlake_(tenant_used_bytes|tenant_limit_bytes)\{' "$work/metrics.txt" | grep -F -e "${tenants[0]}" -e "${tenants[1]}" \
  -e "${tenants[2]}" | indent
grep -E '^vlake_grant_denials_total\{reason="tenant_limit"\}|^vlake_grants_total ' "$work/metrics.txt" | indent
for t in "${tenants[@]}"; do
  grep -E "^vlake_tenant_used_bytes\{.*tenant=\"$t\"" "$work/metrics.txt" | grep -qv ' 0$' ||
    fail "no vlake_tenant_used_bytes for $t in $metrics"
done
say "($(grep -c '^vlake_' "$work/metrics.txt") vlake_* samples in all; docs/metrics.md lists them)"

section "6. tenants free everything and exit"
touch "$work/flags/go.3"
for i in 0 1 2; do
  status=0
  wait "${tenant_pids[$i]}" || status=$?
  bad="$(grep -E ' rc=-?[0-9]+' "$work/tenant-$i.log" | grep -v ' rc=0' | grep -v "^$refused_step rc=2 " || true)"
  if ((status != 0)) || [[ -n "$bad" ]]; then
    indent <"$work/tenant-$i.log" >&2
    fail "tenant ${tenants[$i]} failed (exit $status)"
  fi
  say "${tenants[$i]}: every step done, exited"
done
tenant_pids=()
for _ in $(seq 50); do  # vlaked takes back what exited processes held
  ctl top --json | python3 -c 'import json, sys; sys.exit(any(t["used"] > 0 for g in json.load(sys.stdin)["gpus"] for t in g["tenants"] if t["name"] in sys.argv[1:]))' "${tenants[@]}" && break
  sleep 0.1
done
show "vlakectl --state $state top"
ctl top | indent
ctl top --json | python3 -c 'import json, sys; sys.exit(any(t["used"] > 0 for g in json.load(sys.stdin)["gpus"] for t in g["tenants"] if t["name"] in sys.argv[1:]))' "${tenants[@]}" ||
  fail "the tenants' memory did not come back after they exited"

section "done"
say "${green}demo passed${reset}: three tenants, their limits enforced, top and metrics agree."
say "Stopping vlaked and removing $work and the /dev/shm files."
say "Next: docs/architecture.md (how it fits together), docs/quota.md (the quota file),"
say "docs/vlakectl.md, docs/metrics.md; a real node: README.md, \"Running it on one machine\"."
