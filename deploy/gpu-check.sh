#!/usr/bin/env bash
# One prepared check for a rented GPU node (CUDA or ROCm), run inside the rentune image or any environment
# where `pip install 'rentune[demo]'` is done:
#
#   deploy/gpu-check.sh [STEPS]        # default 50
#   deploy/gpu-check.sh --smoke 4      # a tiny model on the CPU: checks the script itself
#
# Builds a random-init ~1B-parameter Llama from a config (nothing downloaded) and runs rentune's data,
# baseline, probe and train phases on it twice (LoRA, precision auto = bf16, 2048 tokens): padded batches,
# then `training.packing: true`. Prints, for each, tokens/s (non-padding), the padding share and MFU from
# rentune's trial result, and the probe's predicted peak memory against the peak of the first 10 real
# steps. Needs about 40 GB of GPU memory and 10 GB of disk.
set -euo pipefail
export HF_HUB_OFFLINE=1
here="$(cd "$(dirname "$0")" && pwd)"
exec "${PYTHON:-python3}" "$here/gpu_check.py" "$@"
