"""The serving probes: start the image by digest, wait until it serves, run a table of checks.

- aggregated (`serving`): vLLM's OpenAI server in one container;
- disaggregated (`disagg`): Dynamo's frontend, a prefill and a decode worker, each in its own
  container from the same image. The workers join the frontend's network namespace, so every
  plane (Dynamo's request and event planes, vLLM's NIXL side channel, UCX) stays on that
  namespace's loopback; only the frontend's HTTP port is published, on the host's 127.0.0.1.
  Discovery is a directory the three share (no etcd, no NATS); the probe holds its entries'
  entries while the containers run (discovery.py). Ready is what the frontend's own API says: both
  workers listed, and a first completion routed through both (readiness.py, firstrequest.py).

Each engine's time to ready, what its log says that time went on, and its KV capacity go to the
record as `engines` (engines.py).

Every container is removed on every exit path.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from servestack.smoke.checklist import DISCOVERY_DIR, SERVER_PORT, DisaggPlan, ServePlan
from servestack.smoke.containers import _container_name, _log_excerpt, _remove_named
from servestack.smoke.discovery import DiscoveryLeases, all_running
from servestack.smoke.endpoints import AGGREGATED_CHECKS, DISAGGREGATED_CHECKS, ServingCheck, Target
from servestack.smoke.engines import record_engines
from servestack.smoke.firstrequest import FirstRequest
from servestack.smoke.readiness import DynamoWorkers
from servestack.smoke.summary import FAIL, NOT_RUN, PASS, Check
from servestack.util.console import console

if TYPE_CHECKING:
    import requests
    from docker import DockerClient
    from docker.models.containers import Container


# How long each shape may take to serve, when the stack's `smoke_model.ready_timeout_s` does not say.
# A cold start of the production image's smoke model on an H100 took 234 s (120 s of them FlashInfer
# compiling its sampler at engine start), a warm one 80 s; the disaggregated shape on 2 shared CPU
# cores about 100 s. 600 s is 2.5 times the coldest measured.
DEFAULT_READY_TIMEOUT = 600.0

SERVING_CHECKS = ("ready", *(name for name, _ in AGGREGATED_CHECKS))
DISAGG_CHECKS = ("ready", *(name for name, _ in DISAGGREGATED_CHECKS))


def _not_run_serving(reason: str) -> list[Check]:
    return [Check(probe="serving", name=name, status=NOT_RUN, detail=reason) for name in SERVING_CHECKS]


def _not_run_disagg(reason: str) -> list[Check]:
    return [Check(probe="disagg", name=name, status=NOT_RUN, detail=reason) for name in DISAGG_CHECKS]


def _failed_to_start(probe: str, names: tuple[str, ...], problem: str, skipped: str, elapsed: float | None = None) -> list[Check]:
    """`ready` failed with the problem; every later check is not run, saying why."""
    return [Check(probe=probe, name="ready", status=FAIL, detail=problem, time_s=elapsed)] + [Check(probe=probe, name=n, status=NOT_RUN,
                                                                                                    detail=skipped) for n in names[1:]]


def _http() -> requests.Session:
    import requests

    session = requests.Session()
    session.trust_env = False  # never through a proxy: the server is on loopback
    return session


def _run_checks(probe: str, table: tuple[ServingCheck, ...], target: Target) -> list[Check]:
    checks = []
    for name, fn in table:
        start = time.monotonic()
        try:
            status, detail = fn(target)
        except Exception as e:
            status, detail = FAIL, f"{type(e).__name__}: {e}"
        checks.append(Check(probe=probe, name=name, status=status, detail=detail, time_s=round(time.monotonic() - start, 3)))
    return checks


def _log_reader(container: Container) -> Callable[[], str]:
    return lambda: container.logs(stdout=True, stderr=True).decode(errors="replace")


def _published(container: Container, port: int) -> str:
    container.reload()
    bindings = (container.ports or {}).get(f"{port}/tcp") or []
    return f"http://127.0.0.1:{bindings[0]['HostPort']}" if bindings else ""


def _await_ready(http: requests.Session, containers: dict[str, Any], base: Callable[[], str], ready: Callable[[Any, str], bool],
                 start: float, timeout: float, what: str) -> str | None:
    """None when `ready(http, base)` holds before the deadline; else why not (with the log of the
    container that exited, or of every one when time ran out)."""
    deadline = start + timeout
    while True:
        try:
            url = base()
            if url and ready(http, url):
                return None
        except Exception:
            pass
        for role, container in containers.items():
            container.reload()
            if container.status in ("exited", "dead"):
                code = container.attrs.get("State", {}).get("ExitCode")
                return f"the {role} exited with {code} before {what}; {_log_excerpt(container)}"
        if time.monotonic() > deadline:
            logs = "\n".join(f"[{role}] {_log_excerpt(c, 15)}" for role, c in containers.items())
            return f"not ready after {timeout:.0f} s ({what} never held);\n{logs}"
        time.sleep(1.0)


def _health_ok(http: requests.Session, base: str) -> bool:
    return http.get(base + "/health", timeout=5).status_code == 200


def run_serving_probe(
    client: DockerClient,
    reference: str,
    platform: str,
    plan: ServePlan,
    *,
    stack: str = "stack",
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    request_timeout: float = 120.0,
    port: int = SERVER_PORT,
) -> tuple[list[Check], dict[str, Any]]:
    """Start the server in a named container, probe its endpoints, always remove the container."""
    import docker.errors

    metrics: dict[str, Any] = {}
    if plan.command is None:
        return _not_run_serving(plan.reason), metrics
    name = _container_name(stack, "serve")
    container = None
    http = _http()
    start = time.monotonic()
    try:
        try:
            # docker's stubs allow no None for the host port; the API takes it as "any free port".
            container = client.containers.run(  # type: ignore[call-overload]
                reference, plan.command, name=name, detach=True, platform=platform,
                ports={f"{port}/tcp": ("127.0.0.1", None)},
                # vLLM's engine core allocates its IPC buffers in /dev/shm; docker's default is 64 MiB.
                shm_size=plan.shm_size, environment=plan.environment, volumes=plan.volumes, **plan.container,
            )
        except docker.errors.APIError as e:
            return _failed_to_start("serving", SERVING_CHECKS, f"cannot start the server container: {e.explanation or e}",
                                    "the server container did not start"), metrics
        metrics["container"] = name
        console.detail("servestack.smoke", f"serving probe: {name} (deadline {ready_timeout:.0f} s)")
        problem = _await_ready(http, {"server": container}, lambda: _published(container, port), _health_ok,
                               start, ready_timeout, "GET /health returned 200")
        if problem:
            return _failed_to_start("serving", SERVING_CHECKS, problem, "the server never became ready",
                                    round(time.monotonic() - start, 3)), metrics
        ready_s = time.monotonic() - start
        metrics["time_to_ready_s"] = round(ready_s, 2)
        logs = {"server": _log_reader(container)}
        target = Target(base=_published(container, port), model=plan.model, http=http, timeout=request_timeout, metrics=metrics,
                        logs=logs, oracle_vocab=plan.oracle_vocab, gdn_layers=plan.gdn_layers, gpus=plan.gpus,
                        ready_s={"server": round(ready_s, 2)}, logged_at_ready={"server": len(logs["server"]())})
        record_engines(target)
        return [Check(probe="serving", name="ready", status=PASS, detail=f"GET /health 200 after {ready_s:.1f} s",
                      time_s=round(ready_s, 3)),
                *_run_checks("serving", AGGREGATED_CHECKS, target)], metrics
    finally:
        http.close()
        _remove_named(client, name)
        if container is not None:
            metrics["serving_s"] = round(time.monotonic() - start, 2)


def _run_detached(client: DockerClient, reference: str, command: list[str], **kwargs: Any) -> Container:
    """containers.run(detach=True), with the attributes of the started container: the SDK returns
    the ones it read at create time, whose State.Pid is 0, and the lease holder would then ask the
    daemon every second (the fresh-clone CI of e60c1c8 lost the prefill worker's entries so)."""
    container = client.containers.run(reference, command, detach=True, **kwargs)
    container.reload()
    return container


def run_disagg_probe(
    client: DockerClient,
    reference: str,
    platform: str,
    plan: DisaggPlan,
    *,
    stack: str = "stack",
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    request_timeout: float = 120.0,
    baseline: dict[str, Any] | None = None,
) -> tuple[list[Check], dict[str, Any]]:
    """Start frontend + prefill + decode, probe through the frontend, require KV moved over NIXL and
    the aggregated server's answers (`baseline`, its oracle answers) from it."""
    import docker.errors

    metrics: dict[str, Any] = {}
    if not plan.roles:
        return _not_run_disagg(plan.reason), metrics
    containers: dict[str, Any] = {}
    discovery = tempfile.mkdtemp(prefix="servestack-discovery-")
    http = _http()
    start = time.monotonic()
    names = {role.name: _container_name(stack, role.name) for role in plan.roles}
    leases = DiscoveryLeases(discovery, lambda: all_running(list(containers.values())))
    try:
        frontend_id = None
        for role in plan.roles:
            network: dict[str, Any] = (
                {"network_mode": f"container:{frontend_id}"} if frontend_id
                else {"ports": {f"{plan.port}/tcp": ("127.0.0.1", None)}}
            )
            try:
                containers[role.name] = _run_detached(
                    client, reference, list(role.command), name=names[role.name], platform=platform,
                    shm_size=plan.shm_size, environment=role.environment,
                    volumes={discovery: {"bind": DISCOVERY_DIR, "mode": "rw"}}, cpuset_cpus=role.cpus, **network,
                    **role.container,
                )
            except docker.errors.APIError as e:
                return _failed_to_start("disagg", DISAGG_CHECKS, f"cannot start the {role.name} container: {e.explanation or e}",
                                        f"the {role.name} container did not start"), metrics
            frontend_id = frontend_id or containers[role.name].id
        metrics["containers"] = {role: c.name for role, c in containers.items()}
        console.detail("servestack.smoke", f"disaggregated serving probe: {', '.join(metrics['containers'].values())} "
                      f"(deadline {ready_timeout:.0f} s)")
        frontend = containers[plan.roles[0].name]
        # Ready is what the frontend's own API says (readiness.py), whatever DYN_LOG keeps out of its log.
        workers = DynamoWorkers(model=plan.model, started=start)
        first = FirstRequest(registered=workers, routed=workers.routed, model=plan.model,
                             decode_log=_log_reader(containers["decode"]), timeout=request_timeout, started=start, deadline_s=ready_timeout)
        problem = _await_ready(http, containers, lambda: _published(frontend, plan.port), first, start, ready_timeout,
                               "both workers listed by the frontend, and a first completion served through both")
        metrics["first_request"] = first.to_json()
        metrics["workers"] = workers.to_json()
        if problem:
            return _failed_to_start("disagg", DISAGG_CHECKS, first.never(problem), "the disaggregated shape never served",
                                    round(time.monotonic() - start, 3)), metrics
        ready_s = time.monotonic() - start
        metrics["time_to_ready_s"] = round(ready_s, 2)
        metrics["discovery_pinned"] = leases.pin()
        logs = {role: _log_reader(c) for role, c in containers.items()}
        at_ready = {role: len(read()) for role, read in logs.items() if role != "frontend"}
        target = Target(base=_published(frontend, plan.port), model=plan.model, http=http, timeout=request_timeout, metrics=metrics,
                        logs=logs,
                        decode_log_at_ready=at_ready["decode"], oracle_vocab=plan.oracle_vocab, baseline=baseline,
                        gdn_layers=plan.gdn_layers, gpus=plan.gpus, ready_s=dict(workers.registered_s), logged_at_ready=at_ready,
                        workers=workers)
        record_engines(target)
        if plan.placement:
            metrics["placement"] = plan.placement
        return [Check(probe="disagg", name="ready", status=PASS,
                      detail=f"frontend + prefill + decode ready after {ready_s:.1f} s: {first.passed()}",
                      time_s=round(ready_s, 3)),
                *_run_checks("disagg", DISAGGREGATED_CHECKS, target)], metrics
    finally:
        metrics["lease_refresh_longest_gap_s"] = leases.stop()
        http.close()
        for name in reversed(names.values()):  # the workers before the frontend whose namespace they share
            _remove_named(client, name)
        shutil.rmtree(discovery, ignore_errors=True)
        metrics["serving_s"] = round(time.monotonic() - start, 2)
