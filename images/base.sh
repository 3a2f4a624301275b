#!/usr/bin/env bash
# Make (once) the local base image every image of docker-compose.yml is built FROM:
# apg-farm/base:bookworm, Debian bookworm from debootstrap, loaded with `docker import`. No image
# registry is involved.
#
# It is the root filesystem of fixtures/container/image.sh (debootstrap minbase + python3, procps,
# tini; tini as ENTRYPOINT): image.sh builds it the first time (about a minute), imports its cached
# tarball when only that is left (seconds), and does nothing when the image exists. On top of it,
# one layer: this host's own CA certificates (/usr/local/share/ca-certificates/*.crt, if any), so
# that builds behind a TLS-inspecting proxy reach PyPI as the host does (the images that install
# ca-certificates trust them; nothing else is added). That layer is a cached `docker build`: a
# second run takes well under a second. Prints the base's name as the last line of stdout.
#
#   bash images/base.sh && docker-compose build      # or `docker compose build`
#
# Environment: as image.sh (APG_FARM_IMAGE_CACHE, APG_FARM_DEBIAN_MIRROR,
# APG_FARM_DEBOOTSTRAP_TIMEOUT); APG_FARM_BASE_IMAGE names the tag (default apg-farm/base:bookworm).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BASE=${APG_FARM_BASE_IMAGE:-apg-farm/base:bookworm}

CA_DIR=${APG_FARM_EXTRA_CA_DIR:-/usr/local/share/ca-certificates}

rootfs=$(bash "$here/../fixtures/container/image.sh" | tail -n 1)
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mkdir "$context/ca"
if [ -d "$CA_DIR" ]; then
  find "$CA_DIR" -maxdepth 1 -type f -name '*.crt' -exec cp {} "$context/ca/" \;
fi
printf '%s\n' "FROM $rootfs" \
  'COPY ca/ /usr/local/share/ca-certificates/' \
  'WORKDIR /' >"$context/Dockerfile"
# --network none: this layer downloads nothing.
docker build -q --network none -t "$BASE" "$context" >/dev/null 2>"$context/build.log" || {
  cat "$context/build.log" >&2
  exit 1
}
echo "$BASE"
