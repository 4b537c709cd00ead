"""The docker engine as smoke uses it: one client, images by digest, named containers that are always removed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import contextlib
import logging
import re
import uuid

from servestack import platforms
from servestack.errors import ServestackError
from servestack.services.dockerd import ensure_image

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

log = logging.getLogger("servestack.smoke")


def host_docker_platform() -> str:
    return platforms.host_platform()


def _remove(container: Container) -> None:
    import docker.errors

    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        container.remove(force=True)


def _remove_named(client: DockerClient, name: str) -> None:
    """Remove a container by the name it was started under: also the one an interrupt caught while
    `containers.run` was starting it (created, listed, not yet returned)."""
    import docker.errors

    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        client.containers.get(name).remove(force=True)


def _container_name(stack: str, probe: str) -> str:
    return f"servestack-smoke-{re.sub(r'[^a-zA-Z0-9_.-]', '-', stack)}-{probe}-{uuid.uuid4().hex[:8]}"


def _log_tail(container: Container, lines: int = 40) -> str:
    try:
        text = container.logs(stdout=True, stderr=True, tail=lines).decode(errors="replace")
    except Exception as e:  # noqa: BLE001 - the container may be gone already
        return f"(no log: {e})"
    return "\n".join(text.rstrip().splitlines()[-lines:])


_ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b: \S")
# What vLLM's logger puts before every line of a message, tracebacks included:
# "(Worker pid=44) ERROR 12-01 09:00:43 [base_worker.py:1375] ".
_VLLM_PREFIX = re.compile(r"^(?:\([\w-]+ pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                          r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?")


def _log_excerpt(container: Container, lines: int = 40) -> str:
    try:
        text = container.logs(stdout=True, stderr=True).decode(errors="replace")
    except Exception as e:  # noqa: BLE001 - the container may be gone already
        return f"(no log: {e})"
    return log_excerpt(text, lines)


def log_message(line: str) -> str:
    """The line without vLLM's logger prefix."""
    return _VLLM_PREFIX.sub("", line, count=1)


def log_errors(text: str, most: int = 6) -> list[str]:
    """The log's distinct error lines in order, the newest `most`, without vLLM's logger prefix:
    every `SomeError: message` line, and the line that ends each Python traceback whatever its
    exception is called (`zmq.error.Again: Resource temporarily unavailable` ends in neither Error
    nor Exception): the first unindented line after the traceback's frames."""
    errors: list[str] = []
    in_traceback = False
    for line in text.splitlines():
        message = log_message(line).rstrip()
        error = None
        if message.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_traceback and message and not message[0].isspace():
            error, in_traceback = message, False
        elif m := _ERROR_LINE.search(message):
            error = message[m.start():]
        if error and error not in errors:
            errors.append(error)
    return errors[-most:]


def log_excerpt(text: str, lines: int = 40) -> str:
    """The log's error lines (the root cause is usually not in the last lines: vLLM re-raises it
    from the API server), then the last lines."""
    errors = log_errors(text)
    head = ("errors in its log:\n" + "\n".join(f"  {e}" for e in errors) + "\n") if errors else ""
    return head + "last lines of its log:\n" + "\n".join(text.rstrip().splitlines()[-lines:])
