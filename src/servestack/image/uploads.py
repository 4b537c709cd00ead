"""Pushing while building: blobs go to the registry as soon as they are written, and the large packages'
layers are written while the other trees are still being made."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from servestack.errors import PushStopped, ServestackError
from servestack.image import layers
from servestack.image.base_image import Base, base_key, send_base_blob
from servestack.image.layer_plan import Layer, own_layers
from servestack.image.trees import Tree
from servestack.records.steps import BuildRecord
from servestack.sources import registry
from servestack.wheels import normalize

if TYPE_CHECKING:
    from servestack.image.spec import ImagePlan

log = logging.getLogger("servestack.image")


class Uploads:
    """Blobs pushed as soon as they are written, two at a time, each digest once, only those the
    registry lacks: the layers written while trees are still being made go up meanwhile, so the
    push is not all left for after the last tree. `wait` waits for the manifest's blobs; leaving the
    context stops every push still under way (at its next chunk) instead of waiting for it, so an
    interrupted build does not first push a multi-GB blob, and a layer the plan then dropped is not
    pushed to the end."""

    def __init__(self, address: str, repository: str):
        self.address, self.repository = address, repository
        self.on_bytes: Callable[[int], None] | None = None  # progress, once the layer step shows it
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="push")
        self._jobs: dict[str, Future[None]] = {}
        self._pushed: dict[str, int] = {}  # digest -> size, of the blobs the registry lacked
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def __enter__(self) -> Uploads:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self._stopping.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def send(self, digest: str, path: Path | None, size: int, base: Base | None = None) -> None:
        with self._lock:
            if digest not in self._jobs:
                self._jobs[digest] = self._pool.submit(self._push, digest, path, size, base)

    def wait(self, digests: list[str]) -> list[int]:
        """The pushes of `digests` (the manifest's blobs, each sent before) have finished; the first
        failure is raised. Returns the sizes of those the registry lacked. A blob sent but not in
        `digests` (an early layer the plan changed) is not waited for; its failure is only logged."""
        with self._lock:
            jobs = dict(self._jobs)
        for digest in dict.fromkeys(digests):
            jobs[digest].result()
        for digest, job in jobs.items():
            if digest not in digests and job.done() and not job.cancelled() and job.exception() is not None:
                log.warning("push of %s failed; the manifest does not use it: %s", digest, job.exception())
        return [self._pushed[digest] for digest in dict.fromkeys(digests) if digest in self._pushed]

    def _push(self, digest: str, path: Path | None, size: int, base: Base | None) -> None:
        if self._stopping.is_set() or registry.blob_exists(self.address, self.repository, digest):
            return
        if path is not None:
            registry.push_blob(self.address, self.repository, digest, path, self._count)
        elif base is not None:
            send_base_blob(base, self.address, self.repository, digest)
        else:
            raise ServestackError(f"blob {digest}: neither a file here nor a base image's layer")
        self._pushed[digest] = size

    def _count(self, n: int) -> None:
        """Called for each chunk read for the push: where a stopping build gives the push up."""
        if self._stopping.is_set():
            raise PushStopped("image: push given up, the build is stopping")
        if self.on_bytes:
            self.on_bytes(n)


class EarlyLayers:
    """Layers written while the other trees are still being made, so tar and zstd overlap the installs.

    The installs and bytecode leave a core idle whenever fewer trees than cores are left (torch's
    bytecode alone is the longest job), and the layers could not start before the last tree. Here a
    package that will have its own layer is written as soon as its tree is ready, as `plan` makes
    it when no earlier package installed one of its files; the Debian base is compressed first.
    This is speculation that costs time, never correctness: every layer is found by its key, so if
    `plan` drops a file from it the key differs and that layer is written again after planning.
    Each layer written (or found cached) here is handed to `uploads` at once, when there is one.
    """

    def __init__(self, record: BuildRecord, spec: ImagePlan, epoch: int, base: Path | None, uploads: Uploads | None = None):
        self.spec, self.epoch, self.base, self.uploads = spec, epoch, base, uploads
        self.names = {i.sha256: normalize(i.name) for i in record.inputs}
        self.names = {sha: n for sha, n in self.names.items()
                      if sha not in {o.base.sha256 for o in record.overlays}}  # overlaid: split by plan
        self.written: dict[str, int] = {}  # layer key -> bytes tarred, for layers this build wrote
        self._queue: queue.Queue[list[Layer] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="early-layers", daemon=True)
        self._thread.start()

    def offer(self, sha256: str, tree: Tree) -> None:
        """A tree is ready: queue its package's own layer(s), if it will have any."""
        if sha256 in self.names:
            mine = own_layers(self.names[sha256], list(tree.entries), self.spec)
            if mine:
                self._queue.put(mine)

    def _write(self, entries: tuple[layers.Entry, ...]) -> None:
        members = layers.with_parents(entries)
        key = layers.layer_key(members, self.epoch)
        blob = layers.cached(key)
        if blob is None:
            blob = layers.write_layer(members, self.epoch, key)
            self.written[key] = blob.uncompressed
        self._upload(blob)

    def _upload(self, blob: layers.Blob) -> None:
        if self.uploads is not None:
            self.uploads.send(blob.digest, blob.path, blob.size)

    def _run(self) -> None:
        try:
            if self.base is not None:
                self._upload(layers.compress_tarball(self.base, key=base_key(self.base)))
            while (batch := self._queue.get()) is not None:
                for layer in batch:
                    self._write(layer.entries)
        except Exception:  # noqa: BLE001 - speculation only: the layer is written again after planning
            log.warning("writing layers early failed; they are written after planning", exc_info=True)
            while self._queue.get() is not None:
                pass

    def finish(self) -> dict[str, int]:
        self._queue.put(None)
        self._thread.join()
        return self.written
