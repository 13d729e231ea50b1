#!/usr/bin/env bash
# Creates or updates the GCE emulator's Python venv and prints its python.
#
#   tests/emulators/gce/setup.sh [VENV]     # default: <workspace>/target/gce-venv
#
# Installs requirements.txt with pip (from PyPI) into a fresh venv made by
# python3: google-api-python-client, for the Compute discovery document
# (compute.v1.json) that server.py checks every request against. Quick when
# nothing changed: the venv keeps a stamp of requirements.txt's hash and the
# Python version, and only a different stamp (or a venv without the document)
# makes it start over.
# Progress goes to stderr; stdout is only the python path, so
#   py=$(tests/emulators/gce/setup.sh)
# works. server.py also finds the document in the default venv when it is run
# by another python.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${1:-$root/target/gce-venv}"
requirements="$here/requirements.txt"
python=python3

command -v "$python" >/dev/null || { echo "setup.sh: $python is not on PATH" >&2; exit 1; }
want="$(sha256sum "$requirements" | cut -d' ' -f1) $("$python" -c 'import sys; print(sys.version.split()[0])')"
stamp="$venv/.gangway-requirements"
# Prints the document's path; fails when the package or the document is missing.
check='import importlib.util, os, sys
spec = importlib.util.find_spec("googleapiclient")
doc = os.path.join(spec.submodule_search_locations[0], "discovery_cache", "documents", "compute.v1.json")
sys.exit(0 if os.path.isfile(doc) else 1)'

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
  && "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "setup.sh: $venv is up to date" >&2
  echo "$venv/bin/python"
  exit 0
fi

# Anything else starts over: no packages of old pins stay behind.
echo "setup.sh: installing $(grep -m1 '^google-api-python-client' "$requirements") into a new venv $venv" >&2
if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ] && [ -n "$(ls -A "$venv")" ]; then
  echo "setup.sh: $venv exists and is not a venv; not touching it" >&2
  exit 1
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-input -r "$requirements" >&2
"$venv/bin/python" -c "$check" || { echo "setup.sh: compute.v1.json is missing from the package" >&2; exit 1; }
echo "$want" > "$stamp"
echo "setup.sh: done" >&2
echo "$venv/bin/python"
