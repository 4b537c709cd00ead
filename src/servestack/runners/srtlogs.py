"""What srt-slurm's own files say about a job: which node ran what, the addresses each process was
given to advertise, and the KV transfers between prefill and decode nodes.

srt-slurm names each process's log after the node it ran on (worker_stage.py:
`<node>_<mode>_w<i>.out`, frontends/dynamo.py: `<node>_frontend_<i>.out`); its sweep log says where
the infrastructure and the head are (do_sweep.py: "Infra node: ...", "Head node: ..."), and for
each worker "Starting <mode> worker <i> on <node>" then the environment it starts it with ("Env:
K=V ..."), which holds the addresses the worker advertises and connects to (HEAD_NODE_IP,
ETCD_ENDPOINTS, NATS_SERVER, VLLM_NIXL_SIDE_CHANNEL_HOST); infra.out says the head's address
("Host IP: ..."). vLLM's NixlConnector counts its pulls in the decode worker's log.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from pathlib import Path
from typing import Any

from servestack.util.workerlogs import kv_transfers

_PROCESS_LOG = re.compile(r"^(?P<node>[A-Za-z0-9.-]+)_(?P<role>frontend_\d+|(?:prefill|decode|agg)_w\d+)\.out$")
_SWEEP_NODE = re.compile(r"\b(Infra|Head) node: (\S+)")
_STARTING = re.compile(r"Starting (?P<mode>\w+) worker (?P<index>\d+) on (?P<node>\S+)")
_ENV = re.compile(r"\bEnv: (?P<env>.*)$")
_HOST_IP = re.compile(r"\bHost IP: (\S+)")
# The variables whose value is an address another process connects to.
_ADDRESS_VARIABLE = re.compile(r"(_HOST|_IP|_ENDPOINTS|_SERVER|_ADDR)$")


def _host(value: str) -> str:
    """The host of `http://node1:2379`, `nats://node1:4222`, `10.0.0.1:5000` or `10.0.0.1`."""
    parsed = urllib.parse.urlsplit(value if "://" in value else f"//{value}")
    return parsed.hostname or value


def _not_a_node_address(host: str, nodes: set[str], addresses: dict[str, str]) -> str | None:
    """Why `host` is not an address the job's other nodes reach (None: it is one)."""
    if host in nodes:
        return None
    if host == "localhost":
        return "loopback"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"not one of the job's nodes ({', '.join(sorted(nodes))})"
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified:
        return "unspecified (0.0.0.0 is where one listens, not an address to reach)"
    if host not in addresses.values():
        known = ", ".join(f"{n} {a}" for n, a in sorted(addresses.items())) or "none known"
        return f"not the address of any of the job's nodes ({known})"
    return None


def placement(output_dir: Path) -> dict[str, Any]:
    """{"nodes": {role: node}, "advertised": [{role, node, variable, value, problem?}], and for a
    disaggregated job "kv_transfers": {"successful", "failed", "from": [prefill nodes], "to": [decode
    nodes]}}; {} when srt-slurm left no logs."""
    logs = output_dir / "logs"
    nodes: dict[str, str] = {}
    workers: list[tuple[str, str, dict[str, str]]] = []  # (role, node, environment)
    for sweep in sorted(logs.glob("sweep_*.log")):
        starting: tuple[str, str] | None = None
        for line in sweep.read_text(errors="replace").splitlines():
            if m := _SWEEP_NODE.search(line):
                nodes.setdefault(m[1].lower(), m[2])
            elif m := _STARTING.search(line):
                starting = (f"{m['mode']}_w{m['index']}", m["node"])
            elif (m := _ENV.search(line)) and starting:
                env = dict(word.split("=", 1) for word in m["env"].split() if "=" in word)
                workers.append((*starting, env))
                starting = None
    decode_logs = []
    for log in sorted(logs.glob("*.out")) if logs.is_dir() else []:
        if m := _PROCESS_LOG.match(log.name):
            nodes[m["role"]] = m["node"]
            if m["role"].startswith("decode_"):
                decode_logs.append(log)
    if not nodes:
        return {}
    # Each node's address as the job learnt it: the head's from infra.out, a worker's from the side
    # channel srt-slurm resolved on its node (get_hostname_ip).
    addresses: dict[str, str] = {}
    infra = logs / "infra.out"
    if infra.is_file() and (m := _HOST_IP.search(infra.read_text(errors="replace"))) and "infra" in nodes:
        addresses[nodes["infra"]] = m[1]
    for _role, node, env in workers:
        if env.get("VLLM_NIXL_SIDE_CHANNEL_HOST"):
            addresses.setdefault(node, env["VLLM_NIXL_SIDE_CHANNEL_HOST"])
    job_nodes = set(nodes.values())
    advertised = []
    for role, node, env in workers:
        for variable, value in sorted(env.items()):
            if not _ADDRESS_VARIABLE.search(variable) or not value:
                continue
            for part in value.split(","):
                entry = {"role": role, "node": node, "variable": variable, "value": part}
                problem = _not_a_node_address(_host(part), job_nodes, addresses)
                if problem:
                    entry["problem"] = problem
                advertised.append(entry)
    out: dict[str, Any] = {"nodes": nodes, "addresses": addresses, "advertised": advertised}
    if decode_logs:
        totals = {"successful": 0, "failed": 0}
        for log in decode_logs:
            for key, n in kv_transfers(log.read_text(errors="replace")).items():
                totals[key] += n
        out["kv_transfers"] = {**totals,
                               "from": sorted({n for r, n in nodes.items() if r.startswith("prefill_")}),
                               "to": sorted({n for r, n in nodes.items() if r.startswith("decode_")})}
    return out


def address_problems(where: dict[str, Any]) -> list[str]:
    """One line per advertised address the job's other nodes would not reach."""
    return [f"{a['role']} on {a['node']}: {a['variable']}={a['value']}: {a['problem']}"
            for a in where.get("advertised", []) if a.get("problem")]


SRT_RESULT_RE = re.compile(r"results_concurrency_(\d+)_gpus_(\d+)(?:_ctx_(\d+)_gen_(\d+))?\.json$")


def find_srt_results(log_dir: Path) -> dict[int, tuple[Path, int]]:
    """srt-slurm sa-bench results under a job's log dir: {concurrency: (file, total gpus)}."""
    found: dict[int, tuple[Path, int]] = {}
    for path in sorted(Path(log_dir).glob("**/sa-bench_*/results_concurrency_*.json")):
        m = SRT_RESULT_RE.search(path.name)
        if m:
            found[int(m.group(1))] = (path, int(m.group(2)))
    return found
