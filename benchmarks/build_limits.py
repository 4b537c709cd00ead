"""What the image build is held against: the physical limit of this machine (tar | zstd | sha256 and the
same push) and the Debian base alone."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

from servestack import image
from servestack import inputs as build
from servestack.image import layers
from servestack.image.spec import load_plan
from servestack.image.trees import install_all
from servestack.lock import load_lock
from servestack.sources import registry
from servestack.util.project import Project

# --------------------------------------------------------------------------- the physical limit


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime



def physical_limit(project: Project, stack: str, base_tar: Path, work: Path, address: str) -> dict:
    """The same layer trees (the last build's, overlays included) through tar | zstd -3 -T0 | sha256sum,
    then the same blobs pushed."""
    record, locked = build.load_build(project, stack), load_lock(project, stack)
    wheel_paths = {i.sha256: Path(i.path) for i in record.inputs}
    wheel_paths.update({o.wheel.sha256: Path(o.path) for o in record.overlays})
    trees = dict(zip(wheel_paths, install_all([(p, s) for s, p in wheel_paths.items()], locked.python,
                                                 image.interpreter_version(locked, record.platform)), strict=True))
    planned = image.plan(record, locked, trees, load_plan(project.containers / "image.yaml"), work / "gen")
    dirs = []
    for index, layer in enumerate(planned):
        d = work / "limit" / f"{index:02d}"
        for e in layer.entries:
            target = d / e.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if e.kind == "symlink":
                target.symlink_to(e.link)
            elif e.kind == "file":
                with open(target, "wb") as out:
                    layers.copy_content(e, out)
                target.chmod(e.mode)
        dirs.append(d)
    epoch = record.source_date_epoch
    # The same blobs pushed below, the base's too (the image pushes it, and it is compressed below); keyed
    # before the clock starts, as the image step keys its layers while planning.
    keys = [layers.tarball_key(base_tar)] + [layers.layer_key(layer.entries, epoch) for layer in planned]
    cpu, started = cpu_seconds(), time.monotonic()
    subprocess.run(["bash", "-o", "pipefail", "-c", f"zstd -3 -T0 -q -c {base_tar} | sha256sum >/dev/null"], check=True)
    for d in dirs:
        subprocess.run(["bash", "-o", "pipefail", "-c",
                        f"tar --sort=name --numeric-owner --owner=0 --group=0 --mtime=@{epoch} -C {d} -cf - . "
                        f"| zstd -3 -T0 -q | sha256sum >/dev/null"], check=True)
    tar_zstd_sha, tar_zstd_sha_cpu = time.monotonic() - started, cpu_seconds() - cpu
    blobs = [layers.cached(key) for key in keys]
    if None in blobs:
        raise RuntimeError(f"limit: no cached blob for layer key {keys[blobs.index(None)]}: the limit pushes the "
                           "blobs of the build it follows, so it runs right after one")
    started = time.monotonic()
    for blob in blobs:
        registry.push_blob(address, "limit/push", blob.digest, blob.path)
    push = time.monotonic() - started
    return {"tar_zstd_sha256_seconds": round(tar_zstd_sha, 1), "tar_zstd_sha256_cpu_seconds": round(tar_zstd_sha_cpu, 1),
            "cpu_seconds": round(cpu_seconds() - cpu, 1),
            "push_seconds": round(push, 1),
            "seconds": round(tar_zstd_sha + push, 1), "bytes_pushed": sum(b.size for b in blobs),
            "uncompressed": sum(layer.size for layer in planned) + base_tar.stat().st_size}


def debian_base_timings(project: Project, stack: str, work: Path) -> dict:
    """Resolving, fetching and assembling the stack's Debian base, each timed on its own, per platform."""
    from servestack.debian import tarball
    from servestack.lock import debian_base

    base = load_lock(project, stack).base
    platforms = sorted(base.resolved)
    cache = work / "base-cache"
    os.environ["SERVESTACK_CACHE"] = str(cache)
    timings: dict = {}
    for run in ("cold", "warm"):  # cold: the Packages indexes downloaded; warm: from the cache, parsed again
        debian_base._INDEXES.clear()
        started = time.monotonic()
        debian_base.resolve_suite(base.suite, list(base.packages), platforms)
        timings[f"resolve_{run}_s"] = round(time.monotonic() - started, 2)
    for platform in platforms:
        debs = base.debs(platform)
        started = time.monotonic()
        paths = tarball.fetch_debs(base, platform)
        fetched = time.monotonic()
        out = work / f"base-{tarball.ARCH[platform]}.tar"
        tarball.assemble(paths, tarball.ARCH[platform], base.release_date, out)
        assembled = time.monotonic()
        layer = layers.compress_tarball(out)
        timings[platform] = {"packages": len(debs), "debs_mb": round(sum(d.size for d in debs) / 1e6, 1),
                             "fetch_cold_s": round(fetched - started, 2),
                             "assemble_s": round(assembled - fetched, 2),
                             "layer_s": round(time.monotonic() - assembled, 2),
                             "tar_mb": round(out.stat().st_size / 1e6, 1), "layer_mb": round(layer.size / 1e6, 1)}
        out.unlink()
    shutil.rmtree(cache)
    return timings
