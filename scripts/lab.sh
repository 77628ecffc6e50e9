#!/usr/bin/env bash
# JupyterLab on notebooks/, listening on 127.0.0.1 only, behind a token. `make lab` and tests/test_lab.py both run
# this file, so the command line the test checks is the one users get.
#   JUPYTER      the jupyter executable (default: jupyter on PATH; `make lab` passes .venv/bin/jupyter)
#   JUPYTER_TOKEN  a token of your choosing; unset, Jupyter makes one and prints it in the URL
#   extra arguments go to `jupyter lab` as they are (e.g. --port=9999)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
jupyter="${JUPYTER:-jupyter}"
args=(lab --ip=127.0.0.1 --no-browser "--ServerApp.root_dir=$root/notebooks")
# Jupyter refuses to start as root ("Running as root is not recommended"), yet root is who runs containers and
# many cloud notebook VMs; the server stays on loopback behind a token either way, so allow it and say so.
if [ "$(id -u)" = 0 ]; then
  echo "lab: running as root (uid 0): passing --allow-root to jupyter lab" >&2
  args+=(--allow-root)
fi
if [ "${JUPYTER_TOKEN+set}" = set ] && [ -z "$JUPYTER_TOKEN" ]; then
  echo "lab: JUPYTER_TOKEN is set but empty; unset it (Jupyter then makes a token) or give it a value" >&2
  exit 2
fi
# exec: the caller's pid is the server's, so stopping it by that pid stops the server
exec "$jupyter" "${args[@]}" "$@"
