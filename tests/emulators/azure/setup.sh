#!/usr/bin/env bash
# Creates or updates the Azure ARM fake's venv, writes its schema file, and
# prints the venv's python.
#
#   tests/emulators/azure/setup.sh [VENV]     # default: <workspace>/target/azure-venv
#
# Installs requirements.txt with pip (from PyPI) into a fresh venv made by
# python3, then runs extract_schema.py there, which writes VENV/arm-schema.json
# (the models of the chosen API versions, as JSON). server.py reads only that
# file, so any python3 runs the server afterwards. Quick when nothing changed:
# the venv keeps a stamp of requirements.txt's and extract_schema.py's hashes
# and the Python version; only a different stamp (or a missing schema file)
# starts over.
# Progress goes to stderr; stdout is only the python path, so
#   py=$(tests/emulators/azure/setup.sh)
# works.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${1:-$root/target/azure-venv}"
requirements="$here/requirements.txt"
python=python3

command -v "$python" >/dev/null || { echo "setup.sh: $python is not on PATH" >&2; exit 1; }
want="$(cat "$requirements" "$here/extract_schema.py" | sha256sum | cut -d' ' -f1) $("$python" -c 'import sys; print(sys.version.split()[0])')"
stamp="$venv/.gangway-requirements"

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
  && [ -s "$venv/arm-schema.json" ]; then
  echo "setup.sh: $venv is up to date" >&2
  echo "$venv/bin/python"
  exit 0
fi

echo "setup.sh: installing the azure-mgmt-* pins of $requirements into a new venv $venv" >&2
if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ] && [ -n "$(ls -A "$venv")" ]; then
  echo "setup.sh: $venv exists and is not a venv; not touching it" >&2
  exit 1
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-input -r "$requirements" >&2
"$venv/bin/python" "$here/extract_schema.py" "$venv/arm-schema.json" >&2
echo "$want" > "$stamp"
echo "setup.sh: done" >&2
echo "$venv/bin/python"
