#!/usr/bin/env bash
# Installs Slurm and MUNGE from the distribution's packages, for the Slurm
# emulator (start.sh), when they are missing.
#
#   tests/emulators/slurm/install.sh
#
# Needs: slurmctld, slurmd, sinfo/sbatch/srun/scontrol (Debian: slurm-wlm,
# which pulls in slurmctld, slurmd and slurm-client) and munged/munge
# (Debian: munge). Installs with apt-get when any is missing and we are root.
# The packages' own services are not started: a policy-rc.d that refuses all
# starts is in place during the install (and removed after, unless one was
# there before). start.sh runs its own daemons; nothing here uses the system
# ones.
#
# Exit: 0 when everything is there (prints the versions), 3 with a line
# starting `SKIPPED:` when it cannot install (not root, no apt-get), 1 when
# the install itself failed.
set -uo pipefail

need=(slurmctld slurmd sinfo sbatch srun scontrol squeue scancel munged munge unmunge mungekey)
missing() { local c; for c in "${need[@]}"; do command -v "$c" >/dev/null 2>&1 || echo "$c"; done; }
export PATH="$PATH:/usr/sbin:/sbin"

versions() {
  echo "install.sh: $(slurmctld -V 2>&1 | head -1) (slurmctld), $(munged --version 2>&1 | head -1)"
  if command -v dpkg-query >/dev/null; then
    dpkg-query -W -f='install.sh:   package ${Package} ${Version}\n' \
      slurm-wlm slurmctld slurmd slurm-client munge 2>/dev/null
  fi
}

miss="$(missing | tr '\n' ' ')"
if [ -z "$miss" ]; then
  echo "install.sh: Slurm and MUNGE are installed"
  versions
  exit 0
fi

echo "install.sh: missing: $miss"
if [ "$(id -u)" != 0 ]; then
  echo "SKIPPED: Slurm/MUNGE missing ($miss) and not root, so cannot apt-get install slurm-wlm munge"
  exit 3
fi
if ! command -v apt-get >/dev/null; then
  echo "SKIPPED: Slurm/MUNGE missing ($miss) and no apt-get on this machine (install slurmctld, slurmd, the Slurm clients and munge by hand)"
  exit 3
fi

policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# gangway tests/emulators/slurm/install.sh: no service starts during install\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  made_policy=1
fi
cleanup() { [ "$made_policy" = 1 ] && rm -f "$policy"; }
trap cleanup EXIT

pkgs=(slurm-wlm slurm-client munge)
export DEBIAN_FRONTEND=noninteractive
echo "install.sh: apt-get install ${pkgs[*]}"
if ! apt-get install -y -q --no-install-recommends "${pkgs[@]}"; then
  echo "install.sh: install failed; running apt-get update -q and trying again"
  apt-get update -q || true
  if ! apt-get install -y -q --no-install-recommends "${pkgs[@]}"; then
    echo "install.sh: apt-get install ${pkgs[*]} failed" >&2
    exit 1
  fi
fi

miss="$(missing | tr '\n' ' ')"
if [ -n "$miss" ]; then
  echo "install.sh: still missing after the install: $miss" >&2
  exit 1
fi
versions
