"""The disaggregated probe's hold on Dynamo's file discovery while its containers run.

Dynamo 1.6.1's file discovery (lib/runtime/src/storage/kv/file.rs, FileStore::expiry_thread): each
process refreshes its own entries' mtime every TTL/3 = 3.3 s from a plain OS thread, and deletes
ANY entry of the buckets it uses whose mtime is older than DEFAULT_TTL = 10 s (a constant, no
setting); the frontend's model watcher turns the deletion into a Removed discovery event and drops
the worker set for good (lib/llm/src/discovery/watcher.rs -> model.rs remove_worker_set). It is not
the request plane: a failed request only takes an instance out of routing for
DYN_RUNTIME_INHIBITED_DURATION_SECS (lib/runtime/src/component/client.rs report_instance_down).

So on a starved machine a live worker is dropped for good once every process that could refresh
its entries misses 10 s. Two holds, one per phase of the probe:
- until ready, the probe refreshes every entry from the host each second, to a minute ahead;
- once ready (every entry written), it pins the discovery tree: each directory refuses unlinks
  (the immutable attribute, which the containers, without CAP_LINUX_IMMUTABLE, cannot lift), so no
  expiry thread can remove a live worker's entry, however long the machine stalls. The owners'
  keep-alive (it rewrites the mtime of a file that exists) still works.
As soon as a container stops, both holds end: Dynamo expires the dead worker as it would on its
own, the frontend drops it, and the probe's `discovery` check fails naming the lines.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    from docker.models.containers import Container

log = logging.getLogger("servestack.smoke")

LEASE_REFRESH_S = 1.0
# How far ahead of now the holder sets each entry's mtime. Refreshing to now left a 10 s margin: in
# a smoke run beside a qemu image build (load 5-6), the holder and the prefill worker's own
# keep-alive both missed it and another worker expired the prefill worker's entries ("FileStore::
# keep_alive failed opening owned file"; the frontend dropped it and the oracle got 503s). A
# worker's own refresh sets it back to now, and the holder's next one forward again.
LEASE_AHEAD_S = 60.0

# linux/fs.h: the flags ioctls (chattr's) and the immutable flag.
_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_FS_IMMUTABLE_FL = 0x00000010


def container_alive(container: Container) -> bool:
    """Whether the container's init process still runs, from /proc when the daemon is local (no
    daemon round trip: under load a docker API call can take seconds, and the holder must not wait
    on one between refreshes); else from the daemon."""
    pid = (container.attrs.get("State") or {}).get("Pid") or 0
    if pid and os.path.isdir("/proc/1"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    container.reload()
    return container.status == "running"


def all_running(containers: list[Any]) -> bool:
    return all(container_alive(c) for c in containers)


def _set_immutable(directory: str, on: bool) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        [flags] = struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, struct.pack("i", 0)))
        wanted = flags | _FS_IMMUTABLE_FL if on else flags & ~_FS_IMMUTABLE_FL
        if wanted != flags:
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", wanted))
    finally:
        os.close(fd)


class DiscoveryLeases:
    """Holds the entries under `directory` while `running()` says every container runs.

    Why it is needed beyond the TTL margin: after prefilling, the prefill worker holds the request's
    KV blocks for the decode worker's NIXL pull for up to kv_lease_duration (vLLM's 30 s), and
    meanwhile its EngineCore steps every millisecond and its model-runner process spins in
    sched_yield on the shared-memory queue. On a loaded 2-core machine that starved everything else
    for ~30 s (load 30-40), and the VM this runs in has stalled for up to 108 s (the kernel's
    "workqueue lockup" in the fresh-clone CI of 1cfeafa, where the refreshes stopped for 61 s and the
    prefill worker's entries were expired). Refreshing alone starves with the rest; the pin does not.
    """

    def __init__(self, directory: str, running: Callable[[], bool], every: float = LEASE_REFRESH_S):
        self.directory = directory
        self._running = running
        self._every = every
        self._stop = threading.Event()
        self._pinned: list[str] = []
        self._pin_lock = threading.Lock()
        self._last = time.monotonic()
        self.longest_gap = 0.0
        self._keeper = threading.Thread(target=self._hold, name="servestack-discovery-leases", daemon=True)
        self._keeper.start()

    def pin(self) -> bool:
        """Every directory of the tree refuses unlinks from now on; False (and a warning) where the
        file system or the user cannot (tmpfs, no CAP_LINUX_IMMUTABLE): the refreshes go on."""
        with self._pin_lock:
            if self._stop.is_set():
                return False
            try:
                for folder, _, _ in os.walk(self.directory):
                    _set_immutable(folder, True)
                    self._pinned.append(folder)
            except OSError as e:
                log.warning("cannot pin Dynamo's discovery entries in %s (%s): only refreshing them", self.directory,
                            e.strerror)
                self._unpin()
                return False
        log.info("Dynamo discovery pinned: no entry can expire while every container runs")
        return True

    def _unpin(self) -> None:
        for folder in reversed(self._pinned):
            with contextlib.suppress(OSError):
                _set_immutable(folder, False)
        self._pinned.clear()

    def stop(self) -> float:
        """Ends both holds; returns the longest time between two refreshes (smoke.json:
        lease_refresh_longest_gap_s)."""
        self._stop.set()
        self._keeper.join(timeout=5)
        with self._pin_lock:
            self._unpin()
        return round(self.longest_gap, 2)

    def _hold(self) -> None:
        while not self._stop.wait(self._every):
            now = time.monotonic()
            self.longest_gap, self._last = max(self.longest_gap, now - self._last), now
            try:
                alive = self._running()
            except Exception as e:  # noqa: BLE001 - a slow or failing daemon must not end the holder
                log.warning("cannot tell whether the disaggregated containers run (%s): still holding the leases", e)
                alive = True
            if not alive:
                log.warning("a disaggregated container stopped: no longer holding the Dynamo discovery leases")
                with self._pin_lock:
                    self._stop.set()
                    self._unpin()
                return
            if not self._refresh():
                return

    def _refresh(self) -> bool:
        for folder, _, files in os.walk(self.directory):
            for name in files:
                if name.startswith(".tmp_"):  # Dynamo's atomic-write temporaries
                    continue
                ahead = time.time() + LEASE_AHEAD_S
                with contextlib.suppress(FileNotFoundError):
                    try:
                        os.utime(os.path.join(folder, name), (ahead, ahead))
                    except PermissionError:
                        log.warning("cannot refresh Dynamo discovery entries in %s (owned by the containers' "
                                    "user): the workers hold their own leases", self.directory)
                        return False
        return True
