#!/usr/bin/env bash
# Runs the rentune worker on one rented GPU node: it claims queued jobs from the store and runs them one
# at a time until stopped.
#
#   deploy/run-node.sh cuda|rocm|cpu IMAGE STORE_URI [extra rentune worker args]
#   deploy/run-node.sh cuda registry.example.com/rentune:0.1.0-cuda s3://my-bucket/rentune --claim-seconds 600
#
# cpu passes no device: for an image built on a CPU base (tests/integration/test_docker.py runs this script
# that way) or to try a job's data and model paths on a machine without GPUs.
#
# Credentials go by name only, so their values never appear on a command line: export AWS_ACCESS_KEY_ID
# and AWS_SECRET_ACCESS_KEY, plus AWS_SESSION_TOKEN, AWS_ENDPOINT_URL, AWS_REGION and
# RENTUNE_S3_ADDRESSING_STYLE where your store needs them (deploy/STORAGE.md). A variable unset here
# stays unset in the container.
#
# MODELS_DIR=/path/to/models (optional) is mounted read-only at /models, for specs with
# `model.path: /models/<name>`. Models from the bucket (`model.path: s3://...`), the Hugging Face cache
# and DeepSpeed's compiled ops live in the named volume rentune-cache (/cache), kept from one run to the
# next. HF_HUB_OFFLINE=0 lets a `model.hub_id` be downloaded at its pinned revision (the image's default
# is 1: no hub downloads).
#
# The container uses the host's network (NETWORK=host, the default): torchrun's rendezvous and NCCL/RCCL
# between nodes need the host's interfaces, and checkpoint uploads skip docker's NAT. NETWORK=bridge (or
# any docker network) overrides it. RENTUNE_CONTAINER_NAME (default rentune-worker) names the container
# (not CONTAINER_NAME, which shells often set for something else).
#
# `docker stop rentune-worker` (or SIGTERM to this script) stops it: training commits a checkpoint and
# exits 143; run this script again, here or on another node, and the job resumes from the store.
set -euo pipefail

usage() {
  echo "usage: $0 cuda|rocm|cpu IMAGE STORE_URI [extra rentune worker args]" >&2
  exit 2
}

[[ $# -ge 3 ]] || usage
backend=$1
image=$2
store_uri=$3
shift 3

case "$backend" in
  cuda)
    device_args=(--gpus all)
    ;;
  rocm)
    device_args=(--device /dev/kfd --device /dev/dri --group-add video --security-opt seccomp=unconfined)
    # The container runs as uid 1000: it also needs the host's group ids of the devices (render, on most
    # hosts), which need not match any group inside the image.
    declare -A seen_gid=()
    for dev in /dev/kfd /dev/dri/renderD*; do
      if [[ -e $dev ]]; then
        gid=$(stat -c %g "$dev")
        if [[ -z ${seen_gid[$gid]:-} ]]; then
          seen_gid[$gid]=1
          device_args+=(--group-add "$gid")
        fi
      fi
    done
    ;;
  cpu)
    device_args=()
    ;;
  *)
    usage
    ;;
esac

models_args=()
if [[ -n ${MODELS_DIR:-} ]]; then
  if [[ ! -d $MODELS_DIR ]]; then
    echo "run-node: MODELS_DIR=$MODELS_DIR is not a directory" >&2
    exit 2
  fi
  # Absolute: docker reads a relative path as the name of a volume.
  models_args=(--volume "$(cd "$MODELS_DIR" && pwd):/models:ro")
fi

# rentune records RENTUNE_IMAGE_DIGEST in every attempt's env.json. The digest exists only once the image
# is in a registry, so it is read here; an image built locally has none and keeps its build identity.
if ! docker image inspect "$image" >/dev/null 2>&1; then
  docker pull "$image"
fi
digest=$(docker image inspect --format '{{index .RepoDigests 0}}' "$image" 2>/dev/null || true)
digest_args=()
if [[ -n $digest ]]; then
  digest_args=(--env "RENTUNE_IMAGE_DIGEST=$digest")
else
  echo "run-node: $image has no registry digest; rentune records the image's build identity instead" >&2
fi

# No --init: the image's entrypoint already runs tini as PID 1, which forwards SIGTERM and reaps zombies.
cmd=(
  docker run --rm --name "${RENTUNE_CONTAINER_NAME:-rentune-worker}"
  --network "${NETWORK:-host}"
  "${device_args[@]}"
  # Above training.checkpoint.grace_seconds (default 90): docker stop waits this long before SIGKILL.
  --stop-timeout 120
  # torch DataLoader workers and NCCL/RCCL exchange data through /dev/shm; docker's default is 64 MB.
  --shm-size 8g
  --env AWS_ACCESS_KEY_ID
  --env AWS_SECRET_ACCESS_KEY
  --env AWS_SESSION_TOKEN
  --env AWS_ENDPOINT_URL
  --env AWS_ENDPOINT_URL_S3
  --env AWS_REGION
  --env AWS_DEFAULT_REGION
  --env AWS_MAX_ATTEMPTS
  --env RENTUNE_S3_ADDRESSING_STYLE
  --env HF_HUB_OFFLINE
  "${digest_args[@]}"
  --volume rentune-cache:/cache
  "${models_args[@]}"
  "$image"
  worker --store "$store_uri" "$@"
)

printf 'run-node:'
printf ' %q' "${cmd[@]}"
printf '\n'
exec "${cmd[@]}"
