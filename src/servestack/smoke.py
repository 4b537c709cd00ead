"""`servestack smoke`: run the image by digest and prove it is what the lock says, and that it serves.

    result = run_smoke(Project.find(), "dev-cpu")          # image from build/dev-cpu/image.json
    result = run_smoke(project, "qwen35-gb200", image="127.0.0.1:5000/servestack/qwen35-gb200@sha256:...",
                       serve=False)
    sys.exit(result.exit_code)

Two probes, each a list of checks {name, status: pass|fail|not_run, detail}:

1. static (`servestack/probe/static.py`, stdlib only, bind-mounted read-only and run with the
   image's /opt/venv/bin/python, no network): locked versions installed, overlaid files' sha256,
   stack.json's lock is pins/<stack>.lock, each PR included/overlaid/unverified, every engine flag
   and environment variable the stack's recipes (and the stack itself) use is accepted by vLLM's own
   argument parser and env registry, the stack's modules import (GPU-only failures are `not_run`
   with the reason), and which installed modules import an excluded dependency.
   Foreign platforms (linux/arm64 here) run under qemu-user.
2. serving: the engine's OpenAI-compatible server in a named container, port published on
   127.0.0.1 only, with the smoke model; readiness with a deadline, then /health, /v1/models, one
   completion, one chat completion, a streamed completion (first-token latency) and /metrics. The
   container is removed on every exit path (failure, Ctrl-C, SIGTERM). Where it cannot run (no GPU
   for a GPU model, a foreign platform), every serving check is `not_run` with the reason.

Writes build/<stack>/smoke.json and build/<stack>/smoke-junit.xml atomically and prints a summary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform as host_platform
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from .errors import ServestackError
from .fsutil import atomic_write_json, atomic_write_text, sha256_file
from .image import load_image
from .imageref import ImageRef
from .lock import load_lock
from .project import Project
from .stack import normalize
from .tinymodel import VLLM_CPU_ENV

log = logging.getLogger("servestack.smoke")

PASS, FAIL, NOT_RUN = "pass", "fail", "not_run"
PROBE_SCRIPT = Path(__file__).parent / "probe" / "static.py"
PROBE_MOUNT = "/opt/servestack-probe"
VENV_PYTHON = "/opt/venv/bin/python"
STACK_JSON = "/opt/servestack/stack.json"
MODELS_DIR = "/opt/servestack/models"
SERVER_PORT = 8000
DEFAULT_READY_TIMEOUT = 300.0
DEFAULT_STATIC_TIMEOUT = 1800.0  # an arm64 vLLM import under qemu-user takes minutes

# Flags/env the production stacks must have, whatever recipes are committed (the GB200 recipe set).
REQUIRED_ENGINE_USAGE: dict[str, dict[str, dict[str, Any]]] = {
    "qwen35-gb200": {
        "flags": {
            "async-scheduling": True,
            "mamba-ssm-cache-dtype": "float32",
            "language-model-only": True,
            "max-num-batched-tokens": 16384,
            "api-server-count": 2,
            "kv-transfer-config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
            "enable-expert-parallel": True,
            "data-parallel-size": 4,
        },
        "env": {"VLLM_SSM_CONV_STATE_LAYOUT": "DS"},
    },
}

# Module -> the locked distribution that provides it; only modules whose package is locked are checked.
STACK_MODULES: list[tuple[str, tuple[str, ...]]] = [
    ("vllm", ("vllm", "vllm-cpu")),
    ("vllm.entrypoints.openai.api_server", ("vllm", "vllm-cpu")),
    # `python -m dynamo.vllm` / `-m dynamo.frontend` run these; the packages' __init__ import nothing.
    ("dynamo.vllm.main", ("ai-dynamo",)),
    ("dynamo.frontend.main", ("ai-dynamo",)),
    ("nixl", ("nixl", "nixl-cu12", "nixl-cu13")),
    ("flashinfer", ("flashinfer-python",)),
    ("flashinfer.gdn_prefill", ("flashinfer-python",)),
]

# Container environment for serving: no telemetry, no hub.
SERVE_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass
class Check:
    probe: str
    name: str
    status: str
    detail: str = ""
    time_s: float | None = None


@dataclass
class SmokeResult:
    stack: str
    image: str
    platform: str
    checks: list[Check]
    metrics: dict[str, Any]
    wall_s: float
    smoke_json: Path
    junit_xml: Path
    lock_sha256: str = ""

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def passed(self) -> bool:
        return self.ok

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def counts(self) -> dict[str, int]:
        out = {PASS: 0, FAIL: 0, NOT_RUN: 0}
        for c in self.checks:
            out[c.status] = out.get(c.status, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "image": self.image,
            "platform": self.platform,
            "lock_sha256": self.lock_sha256,
            "status": "pass" if self.ok else "fail",
            "counts": self.counts(),
            "wall_s": round(self.wall_s, 2),
            "metrics": self.metrics,
            "checks": [asdict(c) for c in self.checks],
        }

    def summary(self) -> str:
        counts = self.counts()
        lines = [
            f"smoke {self.stack}: {'PASS' if self.ok else 'FAIL'}  "
            f"({counts[PASS]} passed, {counts[FAIL]} failed, {counts[NOT_RUN]} not run; {self.wall_s:.0f} s)",
            f"  image    {self.image} ({self.platform})",
        ]
        m = self.metrics
        if m.get("time_to_ready_s") is not None:
            lines.append(
                f"  serving  ready in {m['time_to_ready_s']:.1f} s, first token {m.get('first_token_latency_s') or 0:.3f} s"
            )
        for c in self.checks:
            if c.status == FAIL:
                lines.append(f"  FAIL     {c.probe}/{c.name}: {_first_lines(c.detail, 12)}")
        not_run = [c for c in self.checks if c.status == NOT_RUN]
        for c in not_run[:10]:
            lines.append(f"  not run  {c.probe}/{c.name}: {_first_lines(c.detail, 1)[:200]}")
        if len(not_run) > 10:
            lines.append(f"  not run  ... and {len(not_run) - 10} more (see {self.smoke_json})")
        lines.append(f"  wrote    {self.smoke_json}, {self.junit_xml}")
        return "\n".join(lines)


def _first_lines(text: str, n: int) -> str:
    lines = text.strip().splitlines()
    return "\n           ".join(lines[:n]) + (" ..." if len(lines) > n else "")


# --------------------------------------------------------------------------- inputs


_PLACEHOLDER = re.compile(r"\{\s*[A-Za-z_][\w.-]*\s*\}")


def _recipe_value(value: Any) -> Any:
    """A value the parser can be asked about; None for sweep placeholders (not checkable)."""
    if isinstance(value, str) and _PLACEHOLDER.search(value):
        return None
    return value


def engine_usage(project: Project, stack: str, lock: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Every engine flag and VLLM_* variable the stack uses: recipes, the stack's environment, the
    flags the smoke server itself is started with, and the stack's required set."""
    flags: dict[str, dict[str, Any]] = {}
    env: dict[str, dict[str, Any]] = {}

    def add(table: dict[str, dict[str, Any]], key: str, value: Any, source: str) -> None:
        entry = table.setdefault(key, {"value": None, "sources": []})
        value = _recipe_value(value)
        if value is not None and entry["value"] is None:
            entry["value"] = value
        if source not in entry["sources"]:
            entry["sources"].append(source)

    import yaml

    recipe_dir = project.recipes / stack
    for path in sorted(recipe_dir.glob("*.y*ml")) if recipe_dir.is_dir() else []:
        rel = path.relative_to(project.root).as_posix()
        try:
            doc = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ServestackError(f"{rel}: not valid YAML ({e})") from None

        def walk(node: Any, where: tuple[str, ...]) -> None:
            if isinstance(node, dict):
                for key, value in node.items():
                    key = str(key)
                    here = (*where, key)
                    parent = where[-1] if where else ""
                    grand = where[-2] if len(where) > 1 else ""
                    if parent == "vllm_config" and isinstance(value, dict):
                        for flag, v in value.items():
                            add(flags, str(flag), v, f"{rel}:{'.'.join(here)}")
                        continue
                    if grand == "roles" and key == "args" and isinstance(value, dict):
                        for flag, v in value.items():
                            add(flags, str(flag), v, f"{rel}:{'.'.join(here)}")
                        continue
                    if (key.endswith("_environment") or key in ("environment", "env")) and isinstance(value, dict):
                        for name, v in value.items():
                            if str(name).startswith("VLLM_"):
                                add(env, str(name), None if v is None else str(v), f"{rel}:{'.'.join(here)}")
                        continue
                    walk(value, here)
            elif isinstance(node, list):
                for i, item in enumerate(node):
                    walk(item, (*where, str(i)))

        walk(doc, ())
    lock_rel = project.lock_file(stack).relative_to(project.root).as_posix()
    for name, value in (lock.get("environment") or {}).items():
        if name.startswith("VLLM_"):
            add(env, name, value, f"{lock_rel}:environment")
    required = REQUIRED_ENGINE_USAGE.get(stack, {})
    for flag, value in required.get("flags", {}).items():
        add(flags, flag, value, "required by the stack")
    for name, value in required.get("env", {}).items():
        add(env, name, value, "required by the stack")
    for flag, value in _serve_flags(lock).items():
        add(flags, flag, value, "the smoke server")
    return {"flags": flags, "env": env}


def _engine(lock: dict[str, Any]) -> str | None:
    names = {normalize(n) for n in lock.get("packages", {})}
    return "vllm" if names & {"vllm", "vllm-cpu"} else None


def _modules(lock: dict[str, Any], platform: str) -> list[str]:
    locked = {normalize(w["name"]) for w in lock.get("platforms", {}).get(platform, [])}
    locked |= {normalize(n) for n in lock.get("packages", {})}
    return [module for module, dists in STACK_MODULES if locked & set(dists)]


def _smoke_model(lock: dict[str, Any]) -> dict[str, Any]:
    return lock.get("smoke_model") or {}


def _served_name(lock: dict[str, Any]) -> str:
    return _smoke_model(lock).get("name") or "smoke"


def _serve_flags(lock: dict[str, Any]) -> dict[str, Any]:
    model = _smoke_model(lock)
    path = f"{MODELS_DIR}/{model['name']}" if "make" in model else model.get("path")
    flags: dict[str, Any] = {
        "model": path,
        "served-model-name": _served_name(lock),
        "host": "0.0.0.0",
        "port": SERVER_PORT,
    }
    if "make" in model:
        # As the stack's CPU recipes serve: eager mode (no torch.compile, so no C++ compiler needed
        # in the image, and ~30 s less start-up on 2 cores).
        flags.update({"max-model-len": 2048, "dtype": "bfloat16", "enforce-eager": True})
    return flags


def serve_command(lock: dict[str, Any], extra: dict[str, Any] | None = None) -> list[str]:
    argv = [VENV_PYTHON, "-m", "vllm.entrypoints.openai.api_server"]
    for flag, value in {**_serve_flags(lock), **(extra or {})}.items():
        argv += [f"--{flag}"] if value is True else [f"--{flag}", str(value)]
    return argv


def probe_config(project: Project, stack: str, lock: dict[str, Any], platform: str, lock_sha256: str) -> dict[str, Any]:
    engine = _engine(lock)
    usage = engine_usage(project, stack, lock) if engine else None
    return {
        "stack": stack,
        "platform": platform,
        "expected_lock_sha256": lock_sha256,
        "stack_json": STACK_JSON,
        "site_packages": None,
        "wheels": [{"name": w["name"], "version": w["version"]} for w in lock.get("platforms", {}).get(platform, [])],
        "pull_requests": lock.get("pull_requests", []),
        "excluded": lock.get("excluded", []),
        "modules": _modules(lock, platform),
        "engine": {"name": engine, **usage} if engine and usage else None,
        "model_dir": _serve_flags(lock)["model"] if "make" in _smoke_model(lock) else None,
    }


# --------------------------------------------------------------------------- docker plumbing


def _docker_client(timeout: int = 900):
    import docker

    from . import services

    services.ensure_dockerd()
    return docker.from_env(timeout=timeout)


def host_docker_platform() -> str:
    machine = host_platform.machine().lower()
    return {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}.get(
        machine, f"linux/{machine}"
    )


def ensure_image(client, reference: str, platform: str) -> None:
    """The image is local (pulled by digest from its registry when it is not)."""
    import docker.errors

    try:
        client.images.get(reference)
        return
    except docker.errors.ImageNotFound:
        pass
    if reference.startswith("127.0.0.1:5000/"):
        from . import services

        services.ensure_registry()
    log.info("pulling %s (%s)", reference, platform)
    repo, digest = reference.split("@", 1)
    try:
        # The low-level pull: ImageCollection.pull() ends with images.get(), which the containerd
        # image store answers "No such image" for a foreign-platform image it has just pulled.
        for event in client.api.pull(repo, tag=digest, platform=platform, stream=True, decode=True):
            if "error" in event:
                raise ServestackError(f"cannot pull {reference} for {platform}: {event['error']}")
    except docker.errors.APIError as e:
        raise ServestackError(f"cannot pull {reference} for {platform}: {e.explanation or e}") from None


class _Terminated(KeyboardInterrupt):
    pass


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every `finally` (container removal) runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):  # noqa: ARG001
        raise _Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _remove(container) -> None:
    import docker.errors

    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        container.remove(force=True)


def _container_name(stack: str, probe: str) -> str:
    return f"servestack-smoke-{re.sub(r'[^a-zA-Z0-9_.-]', '-', stack)}-{probe}-{uuid.uuid4().hex[:8]}"


def _log_tail(container, lines: int = 40) -> str:
    try:
        text = container.logs(stdout=True, stderr=True, tail=lines).decode(errors="replace")
    except Exception as e:  # noqa: BLE001 - the container may be gone already
        return f"(no log: {e})"
    return "\n".join(text.rstrip().splitlines()[-lines:])


_ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b: \S")


def _log_excerpt(container, lines: int = 40) -> str:
    """The distinct `SomeError: message` lines of the whole log (the root cause is usually not in
    the last lines: vLLM re-raises it from the API server), then the last lines."""
    try:
        text = container.logs(stdout=True, stderr=True).decode(errors="replace")
    except Exception as e:  # noqa: BLE001 - the container may be gone already
        return f"(no log: {e})"
    all_lines = text.rstrip().splitlines()
    errors: list[str] = []
    for line in all_lines:
        m = _ERROR_LINE.search(line)
        if m:
            message = line[m.start():].strip()
            if message not in errors:
                errors.append(message)
    head = ("errors in its log:\n" + "\n".join(f"  {e}" for e in errors[-6:]) + "\n") if errors else ""
    return head + "last lines of its log:\n" + "\n".join(all_lines[-lines:])


# --------------------------------------------------------------------------- static probe


# Neoverse V2, the Grace CPU of GB200 nodes.
GRACE_MIDR = "0x00000000410fd4f0"


def _emulated_arm64_cpus(tmp: Path) -> str:
    """A sysfs CPU directory for an arm64 container under qemu-user.

    qemu-user has no arm64 sysfs; torch's oneDNN (xbyak_aarch64) reads each CPU's MIDR_EL1 from
    sysfs at import and crashes without it. The probe only imports and inspects, so describing
    the target's CPU (Grace) is enough; nothing runs on these numbers.
    """
    cpus = tmp / "cpu"
    count = os.cpu_count() or 1
    for name in ("online", "possible", "present"):
        (cpus / name).parent.mkdir(parents=True, exist_ok=True)
        (cpus / name).write_text(f"0-{count - 1}\n")
    for index in range(count):
        ident = cpus / f"cpu{index}" / "regs" / "identification"
        ident.mkdir(parents=True)
        (ident / "midr_el1").write_text(GRACE_MIDR + "\n")
        (ident / "revidr_el1").write_text("0x0000000000000000\n")
    return str(cpus)


def run_static_probe(
    client, reference: str, platform: str, config: dict[str, Any], *, stack: str = "stack", timeout: float = DEFAULT_STATIC_TIMEOUT
) -> list[Check]:
    """Run probe/static.py inside the image (read-only mount, no network) and return its checks."""
    import docker.errors
    import requests

    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="servestack-probe-") as tmp:
        shutil.copy2(PROBE_SCRIPT, Path(tmp) / "static.py")
        (Path(tmp) / "config.json").write_text(json.dumps({**config, "section_timeout": timeout}, indent=1))
        os.chmod(tmp, 0o755)
        volumes = {tmp: {"bind": PROBE_MOUNT, "mode": "ro"}}
        if platform == "linux/arm64" and host_docker_platform() != platform:
            volumes[_emulated_arm64_cpus(Path(tmp))] = {"bind": "/sys/devices/system/cpu", "mode": "ro"}
        container = None
        try:
            container = client.containers.run(
                reference,
                [VENV_PYTHON, f"{PROBE_MOUNT}/static.py", f"{PROBE_MOUNT}/config.json"],
                name=_container_name(stack, "static"),
                detach=True,
                platform=platform,
                network_disabled=True,
                volumes=volumes,
                environment={"PYTHONDONTWRITEBYTECODE": "1"},
            )
            try:
                status = container.wait(timeout=2 * timeout + 300)  # two isolated sections + the scans
            except requests.exceptions.RequestException:
                return [Check("static", "probe", FAIL, f"the static probe did not finish within {timeout:.0f} s\n{_log_tail(container)}",
                              time.monotonic() - start)]
            out = container.logs(stdout=True, stderr=False).decode(errors="replace")
            code = status.get("StatusCode")
            try:
                report = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                err = container.logs(stdout=False, stderr=True, tail=30).decode(errors="replace")
                return [Check("static", "probe", FAIL, f"the static probe exited with {code} and printed no report:\n{err}",
                              time.monotonic() - start)]
        except docker.errors.APIError as e:
            return [Check("static", "probe", FAIL, f"cannot run the static probe in {reference}: {e.explanation or e}",
                          time.monotonic() - start)]
        finally:
            if container is not None:
                _remove(container)
    elapsed = time.monotonic() - start
    checks = [
        Check("static", "probe", PASS,
              f"ran in {elapsed:.1f} s with {report.get('executable')} (Python {report.get('python')}, {report.get('machine')})",
              elapsed)
    ]
    checks += [Check("static", c["name"], c["status"], c.get("detail", "")) for c in report.get("checks", [])]
    return checks


# --------------------------------------------------------------------------- serving probe


@dataclass
class ServePlan:
    command: list[str] | None  # None: cannot run here
    reason: str = ""  # why not, when command is None
    model: str = "smoke"
    environment: dict[str, str] = field(default_factory=dict)
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    gpus: int = 0
    shm_size: str = "2g"


def detect_gpus() -> tuple[int, str]:
    """(number of NVIDIA GPUs this host can give containers, how we know)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0, "nvidia-smi is not installed on this host"
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 0, f"nvidia-smi -L failed: {e}"
    gpus = [line for line in proc.stdout.splitlines() if line.startswith("GPU ")]
    if proc.returncode != 0 or not gpus:
        return 0, f"nvidia-smi -L lists no GPU (exit {proc.returncode}: {proc.stdout.strip()[:200]})"
    return len(gpus), f"nvidia-smi -L lists {len(gpus)} GPU(s)"


def serve_plan(lock: dict[str, Any], platform: str) -> ServePlan:
    model = _smoke_model(lock)
    name = _served_name(lock)
    if _engine(lock) is None:
        return ServePlan(None, "the stack locks no serving engine (vllm) to start", name)
    host = host_docker_platform()
    if platform != host:
        return ServePlan(
            None,
            f"the image is {platform} and this host is {host}: vLLM's server is not started under qemu-user "
            "emulation (start-up would take hours and would not exercise the target's kernels); run smoke on a "
            f"{platform} host",
            name,
        )
    if "make" in model:
        return ServePlan(serve_command(lock), model=name, environment={
            # The image's own environment (the stack's) is what is tested; add only what it lacks.
            k: v for k, v in {**SERVE_ENV, **VLLM_CPU_ENV}.items() if k not in (lock.get("environment") or {})
        })
    gpus, why = detect_gpus()
    if not gpus:
        return ServePlan(None, f"serving {name} from {model.get('path')} needs NVIDIA GPUs and {why}", name)
    path = model.get("path")
    if not path or not Path(path).exists():
        return ServePlan(None, f"{gpus} GPU(s) found, but the smoke model path {path!r} does not exist on this host", name)
    return ServePlan(
        serve_command(lock, {"tensor-parallel-size": gpus}),
        model=name,
        environment=dict(SERVE_ENV),
        volumes={path: {"bind": path, "mode": "ro"}},
        gpus=gpus,
        shm_size="32g",  # NCCL and the engine's IPC buffers across tensor-parallel ranks
    )


SERVING_CHECKS = ("ready", "health", "models", "completions", "chat", "stream", "metrics")


def _not_run_serving(reason: str) -> list[Check]:
    return [Check("serving", name, NOT_RUN, reason) for name in SERVING_CHECKS]


def _http():
    import requests

    session = requests.Session()
    session.trust_env = False  # never through a proxy: the server is on loopback
    return session


def _usage_problem(usage: dict[str, Any] | None) -> str | None:
    if not isinstance(usage, dict):
        return "no usage in the response"
    p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
    if not all(isinstance(x, int) for x in (p, c, t)):
        return f"usage counts missing: {usage}"
    if c <= 0:
        return f"completion_tokens is {c}"
    if p <= 0:
        return f"prompt_tokens is {p}"
    if t != p + c:
        return f"total_tokens {t} != prompt_tokens {p} + completion_tokens {c}"
    return None


def _timed_check(name: str, fn: Callable[[], tuple[str, str]]) -> Check:
    start = time.monotonic()
    try:
        status, detail = fn()
    except Exception as e:  # noqa: BLE001 - a broken endpoint is a failed check
        status, detail = FAIL, f"{type(e).__name__}: {e}"
    return Check("serving", name, status, detail, round(time.monotonic() - start, 3))


def run_serving_probe(
    client,
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
    import docker.types

    metrics: dict[str, Any] = {}
    if plan.command is None:
        return _not_run_serving(plan.reason), metrics
    name = _container_name(stack, "serve")
    container = None
    checks: list[Check] = []
    http = _http()
    start = time.monotonic()
    try:
        kwargs: dict[str, Any] = {}
        if plan.gpus:
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        try:
            container = client.containers.run(
                reference,
                plan.command,
                name=name,
                detach=True,
                platform=platform,
                ports={f"{port}/tcp": ("127.0.0.1", None)},
                # vLLM's engine core allocates its IPC buffers in /dev/shm; docker's default is 64 MiB.
                shm_size=plan.shm_size,
                environment=plan.environment,
                volumes=plan.volumes,
                **kwargs,
            )
        except docker.errors.APIError as e:
            return [Check("serving", "ready", FAIL, f"cannot start the server container: {e.explanation or e}")] + [
                Check("serving", n, NOT_RUN, "the server container did not start") for n in SERVING_CHECKS[1:]
            ], metrics
        metrics["container"] = name
        log.info("serving probe: %s (deadline %.0f s)", name, ready_timeout)

        # -- readiness
        deadline = start + ready_timeout
        ready_problem = None
        base = ""
        while True:
            container.reload()
            if not base:
                bindings = (container.ports or {}).get(f"{port}/tcp") or []
                if bindings:
                    base = f"http://127.0.0.1:{bindings[0]['HostPort']}"
            try:
                if base and http.get(base + "/health", timeout=5).status_code == 200:
                    break
            except Exception:  # noqa: BLE001,S110 - not listening yet
                pass
            container.reload()
            if container.status in ("exited", "dead"):
                code = container.attrs.get("State", {}).get("ExitCode")
                ready_problem = f"the server exited with {code} before becoming ready; {_log_excerpt(container)}"
                break
            if time.monotonic() > deadline:
                ready_problem = (
                    f"the server was not ready after {ready_timeout:.0f} s (GET /health never returned 200); "
                    f"{_log_excerpt(container)}"
                )
                break
            time.sleep(1.0)
        if ready_problem:
            checks.append(Check("serving", "ready", FAIL, ready_problem, round(time.monotonic() - start, 3)))
            checks += [Check("serving", n, NOT_RUN, "the server never became ready") for n in SERVING_CHECKS[1:]]
            return checks, metrics
        ready_s = time.monotonic() - start
        metrics["time_to_ready_s"] = round(ready_s, 2)
        checks.append(Check("serving", "ready", PASS, f"GET /health 200 after {ready_s:.1f} s", round(ready_s, 3)))

        model = plan.model

        def health() -> tuple[str, str]:
            r = http.get(base + "/health", timeout=request_timeout)
            return (PASS, "200") if r.status_code == 200 else (FAIL, f"HTTP {r.status_code}: {r.text[:300]}")

        def models() -> tuple[str, str]:
            r = http.get(base + "/v1/models", timeout=request_timeout)
            if r.status_code != 200:
                return FAIL, f"HTTP {r.status_code}: {r.text[:300]}"
            ids = [m.get("id") for m in r.json().get("data", [])]
            return (PASS, f"serves {ids}") if model in ids else (FAIL, f"serves {ids}, not {model!r}")

        def completions() -> tuple[str, str]:
            r = http.post(base + "/v1/completions", timeout=request_timeout, json={
                "model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            })
            if r.status_code != 200:
                return FAIL, f"HTTP {r.status_code}: {r.text[:500]}"
            body = r.json()
            text = (body.get("choices") or [{}])[0].get("text")
            problem = _usage_problem(body.get("usage"))
            if not isinstance(text, str):
                problem = f"no text in choices: {body.get('choices')}"
            if problem:
                return FAIL, problem
            metrics["completion_usage"] = body["usage"]
            return PASS, f"usage {body['usage']}; text {text[:60]!r}"

        def chat() -> tuple[str, str]:
            r = http.post(base + "/v1/chat/completions", timeout=request_timeout, json={
                "model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
                "temperature": 0, "ignore_eos": True,
            })
            if r.status_code != 200:
                return FAIL, f"HTTP {r.status_code}: {r.text[:500]}"
            body = r.json()
            message = ((body.get("choices") or [{}])[0].get("message") or {})
            problem = _usage_problem(body.get("usage"))
            if problem is None and not isinstance(message.get("content"), str):
                problem = f"no message content: {message}"
            if problem:
                return FAIL, problem
            metrics["chat_usage"] = body["usage"]
            return PASS, f"usage {body['usage']}; content {message['content'][:60]!r}"

        def stream() -> tuple[str, str]:
            t0 = time.monotonic()
            first = None
            chunks = 0
            with http.post(base + "/v1/completions", timeout=request_timeout, stream=True, json={
                "model": model, "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": True,
                "stream": True,
            }) as r:
                if r.status_code != 200:
                    return FAIL, f"HTTP {r.status_code}: {r.text[:500]}"
                for line in r.iter_lines():
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    piece = json.loads(data)
                    if any(c.get("text") for c in piece.get("choices", [])):
                        chunks += 1
                        if first is None:
                            first = time.monotonic() - t0
            total = time.monotonic() - t0
            if first is None:
                return FAIL, "the stream carried no token"
            metrics["first_token_latency_s"] = round(first, 4)
            metrics["stream_total_s"] = round(total, 4)
            return PASS, f"first token after {first * 1000:.0f} ms; {chunks} chunks in {total:.2f} s"

        def prometheus() -> tuple[str, str]:
            r = http.get(base + "/metrics", timeout=request_timeout)
            if r.status_code != 200:
                return FAIL, f"HTTP {r.status_code}: {r.text[:300]}"
            families = sorted({
                line.split("{")[0].split(" ")[0]
                for line in r.text.splitlines()
                if line.startswith("vllm:")
            })
            if not families:
                return FAIL, f"no vllm: metrics in /metrics ({len(r.text)} bytes, starts {r.text[:120]!r})"
            generated = [
                float(line.rsplit(" ", 1)[1]) for line in r.text.splitlines()
                if line.startswith("vllm:generation_tokens_total")
            ]
            extra = f"; vllm:generation_tokens_total {sum(generated):.0f}" if generated else ""
            return PASS, f"{len(families)} vllm: metric families{extra}"

        for check_name, fn in (("health", health), ("models", models), ("completions", completions), ("chat", chat),
                               ("stream", stream), ("metrics", prometheus)):
            checks.append(_timed_check(check_name, fn))
        return checks, metrics
    finally:
        http.close()
        if container is not None:
            _remove(container)
            metrics["serving_s"] = round(time.monotonic() - start, 2)


# --------------------------------------------------------------------------- JUnit


def render_junit(stack: str, checks: list[Check], wall_s: float = 0.0) -> str:
    """One <testcase> per check: not_run is <skipped message=...>, fail is <failure>."""
    failures = sum(1 for c in checks if c.status == FAIL)
    skipped = sum(1 for c in checks if c.status == NOT_RUN)
    suites = ET.Element("testsuites", name=f"servestack smoke {stack}", tests=str(len(checks)),
                        failures=str(failures), skipped=str(skipped), errors="0", time=f"{wall_s:.3f}")
    for probe in dict.fromkeys(c.probe for c in checks):
        mine = [c for c in checks if c.probe == probe]
        suite = ET.SubElement(
            suites, "testsuite", name=f"smoke.{stack}.{probe}", tests=str(len(mine)),
            failures=str(sum(1 for c in mine if c.status == FAIL)),
            skipped=str(sum(1 for c in mine if c.status == NOT_RUN)), errors="0",
            time=f"{sum(c.time_s or 0 for c in mine):.3f}",
        )
        for c in mine:
            case = ET.SubElement(suite, "testcase", classname=f"smoke.{stack}.{probe}", name=c.name,
                                 time=f"{c.time_s or 0:.3f}")
            if c.status == FAIL:
                failure = ET.SubElement(case, "failure", message=(c.detail.strip().splitlines() or [""])[0][:500], type="SmokeFailure")
                failure.text = c.detail
            elif c.status == NOT_RUN:
                ET.SubElement(case, "skipped", message=c.detail[:2000])
            elif c.detail:
                out = ET.SubElement(case, "system-out")
                out.text = c.detail
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


# --------------------------------------------------------------------------- entry point


def run_smoke(
    project: Project,
    stack: str,
    image: str | None = None,
    serve: bool = True,
    *,
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    static_timeout: float = DEFAULT_STATIC_TIMEOUT,
    serve_plan_override: ServePlan | None = None,
    echo: Callable[[str], None] | None = print,
) -> SmokeResult:
    """Smoke-test the stack's image by digest; writes smoke.json + smoke-junit.xml; see module doc.

    Raises ServestackError for unusable input (a tag instead of a digest, no image.json, no lock);
    probe failures are in the result (`result.exit_code` is non-zero when any check failed).
    """
    started = time.monotonic()
    image_json: dict[str, Any] = {}
    if image is None:
        image_json = load_image(project, stack)
        image = image_json.get("reference")
        if not image:
            raise ServestackError(f"{project.artifacts(stack) / 'image.json'}: no `reference`")
    reference = str(ImageRef.parse(image))
    lock = load_lock(project, stack)
    lock_sha256 = sha256_file(project.lock_file(stack))
    platforms = sorted(lock.get("platforms", {}))
    platform = (
        image_json.get("platform")
        or (image_json.get("platforms") or [None])[0]
        or (platforms[0] if platforms else host_docker_platform())
    )
    if platform not in lock.get("platforms", {}):
        raise ServestackError(f"{project.lock_file(stack)}: locks no wheels for the image's platform {platform}")

    checks: list[Check] = []
    metrics: dict[str, Any] = {}
    if image_json.get("lock_sha256") and image_json["lock_sha256"] != lock_sha256:
        checks.append(Check("static", "image-json-lock", FAIL,
                            f"build/{stack}/image.json says the image was built from lock {image_json['lock_sha256']}, "
                            f"but pins/{stack}.lock is now {lock_sha256}: rebuild the image"))
    with _sigterm_as_interrupt():
        client = _docker_client()
        if platform != host_docker_platform() and platform == "linux/arm64":
            from . import services

            services.ensure_binfmt_aarch64()
        try:
            t0 = time.monotonic()
            ensure_image(client, reference, platform)
            pulled = True
            metrics["pull_s"] = round(time.monotonic() - t0, 2)
        except ServestackError as e:
            pulled = False
            checks.append(Check("static", "pull", FAIL, str(e)))
            checks += _not_run_serving("the image could not be pulled")
        if pulled:
            if echo:
                echo(f"smoke {stack}: static probe in {reference} ({platform}) ...")
            t0 = time.monotonic()
            config = probe_config(project, stack, lock, platform, lock_sha256)
            checks += run_static_probe(client, reference, platform, config, stack=stack, timeout=static_timeout)
            metrics["static_probe_s"] = round(time.monotonic() - t0, 2)
        if not pulled:
            pass  # serving checks are already recorded as not run
        elif serve:
            plan = serve_plan_override or serve_plan(lock, platform)
            if echo:
                echo(f"smoke {stack}: serving probe " + ("..." if plan.command else f"not run: {plan.reason}"))
            serving, serve_metrics = run_serving_probe(client, reference, platform, plan, stack=stack,
                                                       ready_timeout=ready_timeout)
            checks += serving
            metrics.update(serve_metrics)
        else:
            checks += _not_run_serving("serving probe disabled (--no-serve)")
    wall = time.monotonic() - started
    out_dir = project.artifacts(stack)
    result = SmokeResult(stack, reference, platform, checks, metrics, wall, out_dir / "smoke.json",
                         out_dir / "smoke-junit.xml", lock_sha256)
    atomic_write_json(result.smoke_json, result.to_json())
    atomic_write_text(result.junit_xml, render_junit(stack, checks, wall))
    if echo:
        echo(result.summary())
    return result


__all__ = [
    "Check",
    "ServePlan",
    "SmokeResult",
    "render_junit",
    "run_serving_probe",
    "run_smoke",
    "run_static_probe",
    "serve_plan",
]
