#!/usr/bin/env bash
# One prepared check for a rented GPU node (CUDA or ROCm), run inside the rentune image or any environment
# where `pip install 'rentune[demo]'` is done:
#
#   deploy/gpu-check.sh [STEPS]        # default 50
#
# Builds a random-init ~1B-parameter Llama from a config (nothing downloaded), runs rentune's data, probe
# and train phases on it (LoRA, bf16, 512 tokens) and prints tokens/s, MFU and the probe's predicted peak
# memory against the peak of the first 10 real steps. Needs about 10 GB of GPU memory and 10 GB of disk.
set -euo pipefail
export HF_HUB_OFFLINE=1
here="$(cd "$(dirname "$0")" && pwd)"
exec "${PYTHON:-python3}" "$here/gpu_check.py" "${1:-50}"
