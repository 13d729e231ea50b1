#!/usr/bin/env bash
# Creates or updates the EC2 emulator's Python venv and prints its python.
#
#   tests/emulators/ec2/setup.sh [VENV]     # default: <workspace>/target/ec2-venv
#
# Installs requirements.txt with pip (from PyPI) into a fresh venv made by
# python3. Quick when nothing changed: the venv keeps a stamp of
# requirements.txt's hash and the Python version, and only a different stamp
# (or a venv that cannot import moto) makes it start over.
# Progress goes to stderr; stdout is only the python path, so
#   py=$(tests/emulators/ec2/setup.sh)
# works. The Rust test helper (tests/support/ec2_emulator.rs) looks for the
# default venv.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${1:-$root/target/ec2-venv}"
requirements="$here/requirements.txt"
python=python3

command -v "$python" >/dev/null || { echo "setup.sh: $python is not on PATH" >&2; exit 1; }
want="$(sha256sum "$requirements" | cut -d' ' -f1) $("$python" -c 'import sys; print(sys.version.split()[0])')"
stamp="$venv/.gangway-requirements"

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
  && "$venv/bin/python" -c 'import moto, flask' 2>/dev/null; then
  echo "setup.sh: $venv is up to date" >&2
  echo "$venv/bin/python"
  exit 0
fi

# Anything else starts over: no packages of old pins stay behind.
echo "setup.sh: installing $(grep -m1 '^moto' "$requirements") into a new venv $venv" >&2
if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ] && [ -n "$(ls -A "$venv")" ]; then
  echo "setup.sh: $venv exists and is not a venv; not touching it" >&2
  exit 1
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-input -r "$requirements" >&2
"$venv/bin/python" -c 'import moto.ec2, flask'
echo "$want" > "$stamp"
echo "setup.sh: done" >&2
echo "$venv/bin/python"
