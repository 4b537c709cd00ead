#!/bin/bash
# srt-slurm setup_script, written by servestack (cluster.py). With PIN_WORKER_CPUS in a worker's
# environment, the shell srtctl starts the worker from, and so the worker with every process it
# starts, may run only on that slice of the CPUs this shell may run on (Cpus_allowed_list), as
# Python slices a list: "-N:" the last N, ":-N" all but the last N. Two workers sharing a node
# split it that way, so neither engine's OpenMP threads share a CPU with the other's busy-polling
# (vLLM's "auto" binding reserves CPUs for other processes only where it has more than it
# reserves: on 2 CPUs an unpinned engine computes on both). Too few CPUs for the slice: it says
# so and pins to what there is. Without it, nothing changes.
set -euo pipefail
slice="${PIN_WORKER_CPUS:-}"
[ -n "$slice" ] || exit 0
if ! [[ "$slice" =~ ^(-[1-9][0-9]*:|:-[1-9][0-9]*)$ ]]; then
    echo "pin-worker-cpus.sh: PIN_WORKER_CPUS=\"$slice\": expected \"-N:\" (the last N CPUs) or \":-N\" (all but the last N)" >&2
    exit 1
fi
allowed_list=$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status)
allowed=()
IFS=, read -ra ranges <<< "$allowed_list"
for range in "${ranges[@]}"; do
    for ((cpu = ${range%-*}; cpu <= ${range#*-}; cpu++)); do allowed+=("$cpu"); done
done
n=${slice//[:-]/}
if [[ "$slice" == -* ]]; then
    if (( n > ${#allowed[@]} )); then
        echo "pin-worker-cpus.sh: PIN_WORKER_CPUS=$slice, but only ${#allowed[@]} CPU(s) are allowed here ($allowed_list): pinning to those" >&2
        n=${#allowed[@]}
    fi
    chosen=$(IFS=,; echo "${allowed[*]: -n}")
else
    if (( n >= ${#allowed[@]} )); then
        echo "pin-worker-cpus.sh: PIN_WORKER_CPUS=$slice leaves none of the ${#allowed[@]} CPU(s) allowed here ($allowed_list): left on all" >&2
        exit 0
    fi
    chosen=$(IFS=,; echo "${allowed[*]:0:${#allowed[@]}-n}")
fi
taskset --pid --cpu-list "$chosen" "$PPID"
