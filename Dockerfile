# syntax=docker/dockerfile:1
# vlake node image: vlaked, vlakectl, vlake-device-plugin, vlake-events and libvlake-hook.so (the Helm chart
# charts/vlake runs all of them from this one image). docs/kubernetes.md, "Building the image":
#
#   docker build -t <registry>/vlake:0.1.0 .
#   docker build --build-arg CUDA_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu24.04 -t … .
#
# vlake compiles against the CUDA driver API headers (cuda.h, cudaTypedefs.h; CUDA 12.8+) and
# links nothing from the toolkit: the driver is loaded at run time from the node (NVIDIA
# container runtime). The headers are taken from an NVIDIA CUDA devel image.
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04

FROM ${CUDA_IMAGE} AS cuda

# ---- build: Debian bookworm, scripts/setup.sh installs the packages and builds the release
# preset (build/release).
FROM debian:bookworm AS build
COPY --from=cuda /usr/local/cuda/include/cuda.h /usr/local/cuda/include/cudaTypedefs.h /usr/local/cuda/include/
WORKDIR /src
COPY . .
RUN VLAKE_K8S_TOOLS=0 ./scripts/setup.sh
# Stage what `cmake --install` puts on a host, component runtime (packaging/install.cmake):
# /usr/bin/{vlaked,vlakectl,vlake-device-plugin,vlake-events}, /usr/lib/vlake/libvlake-hook.so (the one hook
# path of hosts, the Debian package and this image) and /usr/lib/vlake/python; then list the
# Debian packages that own the shared libraries they link.
RUN <<'SH'
set -eu
stage=/stage
DESTDIR="$stage" cmake --install build/release --component runtime --strip
for b in vlaked vlakectl vlake-device-plugin vlake-events; do
  [ -x "$stage/usr/bin/$b" ] || { echo "the install has no /usr/bin/$b" >&2; exit 1; }
done
[ -f "$stage/usr/lib/vlake/libvlake-hook.so" ] || { echo "the install has no /usr/lib/vlake/libvlake-hook.so" >&2; exit 1; }
mkdir -p "$stage/usr/share/vlake"
for f in "$stage"/usr/bin/* "$stage/usr/lib/vlake/libvlake-hook.so"; do ldd "$f"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  while read -r lib; do
    real="$(readlink -f "$lib")"
    for p in "$lib" "$real" "/usr$lib" "/usr$real" "${lib#/usr}" "${real#/usr}"; do
      pkg="$(dpkg-query -S "$p" 2>/dev/null | head -n1)"
      if [ -n "$pkg" ]; then echo "${pkg%%:*}"; continue 2; fi
    done
    echo "no Debian package owns $lib" >&2; exit 1
  done | sort -u > "$stage/usr/share/vlake/runtime-packages.txt"
[ -s "$stage/usr/share/vlake/runtime-packages.txt" ]
cat "$stage/usr/share/vlake/runtime-packages.txt"
SH

# ---- runtime: the binaries, the hook, and exactly the Debian libraries they link.
FROM debian:bookworm-slim
COPY --from=build /stage/ /
RUN apt-get update \
 && xargs -a /usr/share/vlake/runtime-packages.txt \
      apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* \
 && vlaked --help >/dev/null && vlakectl --help >/dev/null && vlake-device-plugin --help >/dev/null \
 && vlake-events --help >/dev/null
LABEL org.opencontainers.image.title="vlake" \
      org.opencontainers.image.description="vlake multi-tenant GPU memory virtualization: vlaked, vlakectl, vlake-device-plugin, vlake-events, libvlake-hook.so"
# vlaked and the device plugin run as root (host sockets, /dev/shm, the kubelet's directories).
CMD ["vlaked", "--help"]
