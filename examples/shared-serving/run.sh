#!/usr/bin/env bash
# Serving replicas of one model on one GPU, with and without vlake's weight sharing: checks that
# every replica answers exactly as a run without vlake, and prints the GPU memory NVML reports
# (nvidia-smi) for each case. README.md says what to expect and how to adapt it.
#
#   ./run.sh                 build the example model, 4 replicas
#   MODEL=/path/to/model ./run.sh      your own model (a from_pretrained directory)
#
# Environment: REPLICAS (4), MODEL (built into the work directory), PYTHON (python3),
# VLAKED / VLAKE_HOOK / VLAKECTL (the build tree's, else the installed ones), GPU (0, the
# nvidia-smi index), SETTLE (12: seconds to wait before measuring), KEEP=1 keeps the work
# directory (logs, outputs).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
replicas=${REPLICAS:-4}
python=${PYTHON:-python3}
gpu=${GPU:-0}
settle=${SETTLE:-12}
build=${VLAKE_BUILD:-$root/build/release}
pick() { # first executable of: an explicit value, a build-tree path, a name on PATH
  if [[ -n "$1" ]]; then echo "$1"; elif [[ -e "$2" ]]; then echo "$2"; else command -v "$3" || echo "$4"; fi
}
vlaked=$(pick "${VLAKED:-}" "$build/pool/vlaked" vlaked "")
hook=$(pick "${VLAKE_HOOK:-}" "$build/hook/libvlake-hook.so" "" /usr/lib/vlake/libvlake-hook.so)
vlakectl=$(pick "${VLAKECTL:-}" "$build/ctl/vlakectl" vlakectl "")
[[ -x "$vlaked" ]] || { echo "run.sh: vlaked not found (build vlake or set VLAKED)" >&2; exit 1; }
[[ -e "$hook" ]] || { echo "run.sh: libvlake-hook.so not found (set VLAKE_HOOK)" >&2; exit 1; }
command -v nvidia-smi >/dev/null || { echo "run.sh: nvidia-smi not found" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/vlake-shared-serving.XXXXXX")
model=${MODEL:-$work/model}
state=vlake-example-$$
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
daemon=""
children=()
cleanup() {
  for p in "${children[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -n "$daemon" ]] && { kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; }
  if [[ "${KEEP:-0}" == 1 ]]; then echo "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$gpu" | tr -d ' '; }

printf '%s\n' "The quick brown fox" "Shared weights, private activations." "vlake" \
  "Four replicas, one copy of the weights" >"$work/prompts.txt"
nprompts=$(wc -l <"$work/prompts.txt")

if [[ ! -d "$model" ]]; then
  echo "== building the example model (random weights, fp16) in $model"
  "$python" "$here/make_model.py" "$model"
fi

echo "== reference: one replica without vlake"
"$python" "$here/serve.py" "$model" --no-share <"$work/prompts.txt" >"$work/reference.jsonl" 2>"$work/reference.err" ||
  { tail -n 20 "$work/reference.err"; exit 1; }
grep -v '"event"' "$work/reference.jsonl" >"$work/reference.answers"

echo "== starting vlaked"
cat >"$work/vlake.yaml" <<YAML
version: 1
default:
  dedup_domain: replicas   # this node's tenants trust each other: identical chunks are stored once
YAML
"$vlaked" --config "$work/vlake.yaml" --socket "$work/vlaked.sock" --state "$state" \
  --pool-idle-release 5s >"$work/vlaked.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [[ -S "$work/vlaked.sock" ]] && break; sleep 0.1; done
[[ -S "$work/vlaked.sock" ]] || { tail -n 20 "$work/vlaked.log"; exit 1; }
sleep 2
baseline=$(used)

# replicas NAME ARGS...: starts $replicas serve.py processes under the hook, sends each the
# prompts (unless --context-only), waits for every answer, waits $settle s, sets $measured to
# NVML's used memory, then ends them.
replicas_run() {
  local name=$1
  shift
  local i fd pids=() fds=()
  for i in $(seq "$replicas"); do
    mkfifo "$work/$name.$i.in"
    env LD_PRELOAD="$hook" VLAKE_SOCKET="$work/vlaked.sock" VLAKE_RESERVE_AGE=5s \
      "$python" "$here/serve.py" "$@" <"$work/$name.$i.in" >"$work/$name.$i.jsonl" 2>"$work/$name.$i.err" &
    pids+=($!)
    children+=($!)
    exec {fd}>"$work/$name.$i.in"
    fds+=("$fd")
  done
  local want=1
  [[ " $* " == *" --context-only "* ]] || {
    want=$((1 + nprompts))
    for fd in "${fds[@]}"; do cat "$work/prompts.txt" >&"$fd"; done
  }
  for i in $(seq "$replicas"); do
    while (($(grep -c '^{' "$work/$name.$i.jsonl" || true) < want)); do
      kill -0 "${pids[$((i - 1))]}" 2>/dev/null || { echo "replica $i ($name) died:"; tail -n 20 "$work/$name.$i.err"; exit 1; }
      sleep 0.5
    done
  done
  sleep "$settle"
  measured=$(used)
  if [[ -n "$vlakectl" ]]; then "$vlakectl" --state "$state" pool >"$work/$name.pool.txt" 2>&1 || true; fi
  for fd in "${fds[@]}"; do exec {fd}>&-; done
  for p in "${pids[@]}"; do wait "$p" || true; done
  children=()
}

echo "== $replicas processes with CUDA initialised and no model (what the processes cost by themselves)"
replicas_run contexts --context-only
contexts=$measured
echo "== $replicas replicas, weights shared"
replicas_run shared "$model"
shared=$measured
echo "== $replicas replicas, weights not shared (under vlake all the same)"
replicas_run private "$model" --no-share
private=$measured

same=1
for name in shared private; do
  for i in $(seq "$replicas"); do
    if ! grep -v '"event"' "$work/$name.$i.jsonl" | cmp -s - "$work/reference.answers"; then
      echo "replica $i ($name): answers differ from the reference"
      same=0
    fi
  done
done
grep -m1 '"event": "ready"' "$work/shared.1.jsonl"
replica_mib=$(grep -m1 '"event": "ready"' "$work/shared.1.jsonl" |
  "$python" -c 'import json,sys; print(round(json.loads(sys.stdin.readline())["replica_bytes"] / 2**20))')

echo
printf '%-52s %10s %12s\n' "GPU $gpu, NVML used memory (MiB)" "used" "- contexts"
printf '%-52s %10s\n' "vlaked alone" "$baseline"
printf '%-52s %10s\n' "$replicas processes, CUDA initialised, no model" "$contexts"
printf '%-52s %10s %12s\n' "$replicas replicas, shared" "$shared" "$((shared - contexts))"
printf '%-52s %10s %12s\n' "$replicas replicas, not shared" "$private" "$((private - contexts))"
echo "one replica's weights: $replica_mib MiB; sharing saved $((private - shared)) MiB"
if [[ -s "$work/shared.pool.txt" ]]; then
  echo
  echo "vlakectl pool while the shared replicas ran (GRANTED charges each replica all its weights):"
  sed -n '3,4p' "$work/shared.pool.txt"
fi
if ((same)); then
  echo "answers: every replica identical to the run without vlake"
else
  echo "answers: DIFFERENT (see $work; KEEP=1 keeps it)"
  exit 1
fi
