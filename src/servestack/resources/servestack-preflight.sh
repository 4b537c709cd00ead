#!/bin/bash
# servestack preflight: the node has what the job needs, or the job ends here, naming what is missing.
min_driver=${SERVESTACK_PREFLIGHT_MIN_DRIVER:?}
gpus_wanted=${SERVESTACK_PREFLIGHT_GPUS:?}
nodes=${SERVESTACK_PREFLIGHT_NODES:-1}
node=$(hostname)
missing=()
if ! command -v nvidia-smi >/dev/null 2>&1; then
    missing+=("no NVIDIA driver: nvidia-smi is not on PATH (driver >= $min_driver needed)")
    missing+=("no GPUs: 0 of the $gpus_wanted per node the recipe places")
else
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)
    if [[ -z $driver ]]; then
        missing+=("no NVIDIA driver answers nvidia-smi (driver >= $min_driver needed)")
    elif (( ${driver%%.*} < min_driver )); then
        missing+=("NVIDIA driver $driver is older than $min_driver (CUDA 13)")
    fi
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    if (( gpus < gpus_wanted )); then
        missing+=("no GPUs: $gpus of the $gpus_wanted per node the recipe places")
    fi
fi
if (( nodes > 1 )) && ! ls /dev/nvidia-caps-imex-channels/channel* >/dev/null 2>&1; then
    missing+=("no IMEX channel (/dev/nvidia-caps-imex-channels/channel*): multi-node NVLink needs the IMEX daemon")
fi
# UCX's InfiniBand transports need an active verbs port; its cuda_ipc transport needs GPUs.
active=$(cat /sys/class/infiniband/*/ports/*/state 2>/dev/null | grep -c ACTIVE)
if (( active == 0 )) && ! command -v nvidia-smi >/dev/null 2>&1; then
    missing+=("no UCX transport for KV transfer: no active InfiniBand port (/sys/class/infiniband) and no GPUs for cuda_ipc")
fi
if (( ${#missing[@]} )); then
    for m in "${missing[@]}"; do echo "servestack preflight: $node: $m" >&2; done
    exit 3
fi
echo "servestack preflight: $node: driver $driver, $gpus GPU(s), $active active InfiniBand port(s)" >&2
