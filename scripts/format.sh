#!/usr/bin/env bash
# Checks or fixes the formatting of vlake's C and C++ sources and headers with clang-format (style:
# .clang-format at the root). Only files git tracks are touched, so build trees, tools/k8s's
# node_modules and other generated or fetched files never are; the `skip` pattern below names
# tracked files that are not vlake's to format (none today).
#
#   ./scripts/format.sh --check          # lists every file that differs and where; exit 1 if any (CI)
#   ./scripts/format.sh --fix            # rewrites those files in place
#   ./scripts/format.sh --check FILE...  # only these files
#   CLANG_FORMAT=clang-format-14 ./scripts/format.sh --check
#
# The style is checked with Debian bookworm's clang-format 14 (scripts/setup.sh installs it); other
# versions may disagree on a few constructs.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
  --check | --fix) shift ;;
  *)
    echo "usage: scripts/format.sh --check|--fix [FILE...]" >&2
    exit 2
    ;;
esac
clang_format="${CLANG_FORMAT:-clang-format}"
if ! command -v "$clang_format" >/dev/null 2>&1; then
  echo "format.sh: $clang_format not found (scripts/setup.sh installs Debian's clang-format)" >&2
  exit 1
fi

skip='^(build|\.deps|\.cache|tools/k8s/node_modules|third_party)/|\.pb\.(h|cc)$'
files=()
if (($#)); then
  files=("$@")
else
  while IFS= read -r -d '' f; do
    [[ -f "$f" && ! "$f" =~ $skip ]] && files+=("$f")  # -f: tracked but deleted in the work tree
  done < <(git ls-files -z -- '*.c' '*.cc' '*.cpp' '*.cxx' '*.h' '*.hh' '*.hpp' '*.hxx' '*.cu' '*.cuh')
fi

if [[ "$mode" == --fix ]]; then
  printf '%s\0' "${files[@]}" | xargs -0 -r "$clang_format" -i --style=file
  echo "format.sh: formatted ${#files[@]} files with $("$clang_format" --version)"
  exit 0
fi

# One clang-format error per file (its first difference); the list of files at the end.
bad=()
for f in "${files[@]}"; do
  if ! "$clang_format" --dry-run -Werror --ferror-limit=1 --style=file "$f"; then
    bad+=("$f")
  fi
done
if ((${#bad[@]})); then
  echo "format.sh: ${#bad[@]} of ${#files[@]} files are not formatted ($("$clang_format" --version)):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "format.sh: run ./scripts/format.sh --fix to format them" >&2
  exit 1
fi
echo "format.sh: ${#files[@]} files formatted as .clang-format says"
