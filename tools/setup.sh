#!/usr/bin/env bash
# Set up the main job on a Debian machine, from nothing but python3:
#   1. apt-get installs MariaDB, sysbench, Java (for Spark) and pip if missing (and stops the
#      packaged service);
#   2. pip installs setl from this checkout (editable);
#   3. `tools/demo.py up` starts two throwaway MariaDB servers in var/dev (reusing running
#      ones) and creates the demo schema and data on the source, the schema on the target.
# Re-runnable: every step skips what is already done. Afterwards: setl start --pipeline p1
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

missing=()
[ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
command -v mariadb > /dev/null || missing+=(mariadb-client)
command -v sysbench > /dev/null || missing+=(sysbench)
command -v java > /dev/null || missing+=(default-jre-headless)  # p1 runs a transform step on Spark
python3 -m pip --version > /dev/null 2>&1 || missing+=(python3-pip)  # Debian's python3 comes without it
# The compiled row decoder (setup.py) needs a C compiler and Python's headers.
command -v gcc > /dev/null || missing+=(gcc libc6-dev)
python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"],
    "Python.h")))' || missing+=(python3-dev)
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]} with apt-get"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" procps > /dev/null
    # Debian starts the packaged server on install; the demo runs its own on other ports.
    $SUDO service mariadb stop > /dev/null 2>&1 || true
fi

# Installed from this checkout, with a working `setl` command? (Checked from /, where the
# checkout itself is not importable.)
installed() {
    (cd / && python3 -c 'import setl, sys; sys.exit(not setl.__file__.startswith(sys.argv[1]))' "$1/" \
        && setl --help) > /dev/null 2>&1
}
if ! installed "$PWD"; then
    echo "setup: pip installing setl from $PWD"
    pip_flags=(-q -e .)
    # Debian's system Python refuses pip installs outside a virtualenv (PEP 668).
    if python3 -c 'import sys, sysconfig, os; sys.exit(not (sys.prefix == sys.base_prefix and
            os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))'; then
        pip_flags+=(--break-system-packages)
    fi
    python3 -m pip install "${pip_flags[@]}"
fi

python3 tools/demo.py up
echo "setup: done. Next: setl start --pipeline p1 [--until-caught-up]"
