#!/usr/bin/env bash
# Launch `refinery train` on every node of a multi-node job with torchrun (elastic c10d rendezvous).
# Run the same command on each node; node 0's address is the rendezvous point. The trainer reads the
# phase manifests and shards from the config's data root (s3://... through the local shard cache),
# and its global batch is fixed by the config, so the data order does not depend on the world size.
#
#   NNODES=4 NPROC_PER_NODE=8 RDZV_HOST=trainer-0.trainer RUN_ID=run-001 \
#   REFINERY_CONFIG=/app/deploy/k8s/refinery-s3.yaml deploy/torchrun/launch.sh
#
# On one machine: NNODES=1 RDZV_HOST=127.0.0.1 deploy/torchrun/launch.sh
set -euo pipefail

: "${REFINERY_CONFIG:?set REFINERY_CONFIG to the config file (e.g. deploy/k8s/refinery-s3.yaml)}"
: "${RDZV_HOST:?set RDZV_HOST to the hostname or address of node 0}"
NNODES="${NNODES:-1}"
NPROC_PER_NODE="${NPROC_PER_NODE:-gpu}"
RDZV_PORT="${RDZV_PORT:-29400}"
RUN_ID="${RUN_ID:-refinery}"
MAX_RESTARTS="${MAX_RESTARTS:-3}"

refinery_bin="$(command -v refinery)" || { echo "refinery is not installed in this environment (pip install -e .)" >&2; exit 2; }

cmd=(torchrun
  --nnodes="${NNODES}"
  --nproc-per-node="${NPROC_PER_NODE}"
  --rdzv-backend=c10d
  --rdzv-endpoint="${RDZV_HOST}:${RDZV_PORT}"
  --rdzv-id="${RUN_ID}"
  --max-restarts="${MAX_RESTARTS}"
  "${refinery_bin}" train --config "${REFINERY_CONFIG}" "$@")

if [[ "${DRY_RUN:-0}" == "1" ]]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
exec "${cmd[@]}"
