#!/usr/bin/env bash
# Builds Kueue (sigs.k8s.io/kueue, pinned below) from source with the module
# proxy into OUT_DIR/kueue, and copies the manifests `k8s-harness serve
# --kueue OUT_DIR/kueue` applies (its CRDs and webhook configurations, from
# the same module source) into OUT_DIR/kueue-config. Kueue is a binary of
# its own: it needs k8s.io libraries v0.35 where the harness pins v0.37.
# Nothing is built when the binary is there and kueue-config/VERSION names
# the pinned version (and this script is not newer than the binary).
#
#   tests/emulators/k8s/build-kueue.sh OUT_DIR
#
# Exit 3: no Go here (callers treat that as "cannot run here").
set -euo pipefail
version=v0.17.0
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build-kueue.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
bin="$out/kueue"
cfg="$out/kueue-config"
go=go
if ! command -v go >/dev/null; then
  if [ -x /usr/local/go/bin/go ]; then go=/usr/local/go/bin/go; else
    echo "build-kueue.sh: no Go on PATH or in /usr/local/go" >&2; exit 3
  fi
fi
if [ -x "$bin" ] && [ "$(cat "$cfg/VERSION" 2>/dev/null)" = "sigs.k8s.io/kueue@$version" ] \
   && [ -z "$(find "$here/build-kueue.sh" -newer "$bin")" ]; then
  echo "$bin"
  exit 0
fi
# Outside any module: `go install pkg@version` builds with Kueue's own go.mod
# (it has no replace directives).
cd /
tmp="$(mktemp -d "$out/.kueue-build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" GOFLAGS=-trimpath "$go" install "sigs.k8s.io/kueue/cmd/kueue@$version" >&2
src="$("$go" mod download -json "sigs.k8s.io/kueue@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -d "$src/config/components/crd/bases" ] || { echo "build-kueue.sh: no Kueue source at '$src'" >&2; exit 1; }
rm -rf "$cfg"
mkdir -p "$cfg/crd" "$cfg/webhook"
cp "$src"/config/components/crd/bases/*.yaml "$cfg/crd/"
cp "$src/config/components/webhook/manifests.yaml" "$cfg/webhook/"
chmod -R u+w "$cfg"
echo "sigs.k8s.io/kueue@$version" > "$cfg/VERSION"
mv "$tmp/kueue" "$bin"
echo "$bin"
