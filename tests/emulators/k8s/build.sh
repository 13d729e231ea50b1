#!/usr/bin/env bash
# Builds the k8s harness (one Go binary: etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager and kubectl from k8s.io/kubernetes v1.37.2, plus
# the node agents) into OUT_DIR and prints its path. Go's own module and
# build caches (outside the clone) keep a rebuild fast; nothing is built when
# the binary is newer than every source file, go.sum and this script.
#
#   tests/emulators/k8s/build.sh OUT_DIR
#
# Exit 3: no Go here (callers treat that as "cannot run here").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
bin="$out/k8s-harness"
go=go
if ! command -v go >/dev/null; then
  if [ -x /usr/local/go/bin/go ]; then go=/usr/local/go/bin/go; else
    echo "build.sh: no Go on PATH or in /usr/local/go" >&2; exit 3
  fi
fi
if [ -x "$bin" ] && [ -z "$(find "$here" -maxdepth 1 \( -name '*.go' -o -name go.mod -o -name go.sum -o -name build.sh \) -newer "$bin")" ]; then
  echo "$bin"
  exit 0
fi
cd "$here"
# The version the components report (/version; without it "v0.0.0-master",
# which Kueue cannot parse and exits on), as a release build sets it.
v=v1.37.2
"$go" build -trimpath -o "$bin.tmp" \
  -ldflags "-X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/component-base/version.gitTreeState=clean" \
  . >&2
mv "$bin.tmp" "$bin"
echo "$bin"
