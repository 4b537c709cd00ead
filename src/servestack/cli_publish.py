"""`servestack publish`, `pull`, `verify` and `keygen`: the signed bundle beside an image."""

from __future__ import annotations

import argparse
from pathlib import Path

from servestack.commands import command
from servestack.commands import image_arg as _image_arg
from servestack.util.console import console
from servestack.util.project import Project


def _publish_args(p: argparse.ArgumentParser) -> None:
    _image_arg(p)
    p.add_argument("--records", type=Path, help="a directory `pull` wrote for this digest: its lock and build/image/"
                                               "smoke records are published (default: this checkout's)")
    p.add_argument("--to", help="REGISTRY/REPOSITORY to copy the image to (by digest) and publish there")
    p.add_argument("--run", dest="run_id", help="include build/<stack>/runs/<RUN>/ results, reports and plots")
    p.add_argument("--key", type=Path, default=Path("servestack.key"), help="ECDSA P-256 private key (servestack keygen)")
    p.add_argument("--allow-static-smoke", action="store_true",
                   help="publish although smoke served nothing (its static probe alone); the signed statement says so")


@command("publish", "push the image's signed bundle (recipes, lock, records, results) as OCI referrers", _publish_args)
def _publish(args: argparse.Namespace, project: Project) -> int:
    from servestack import publish

    if args.image:  # a tag is refused before the records are read
        from servestack.records.imageref import ImageRef

        ImageRef.parse(args.image)
    publish.publish(project, args.stack, key=args.key, image=args.image, to=args.to, run_id=args.run_id,
                    records_dir=args.records, allow_static_smoke=args.allow_static_smoke)
    return 0


def _pull_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("reference", help="REGISTRY/REPO@sha256:<64 hex> (tags are refused)")
    p.add_argument("--key", type=Path, required=True, help="the publisher's public key (PEM)")
    p.add_argument("--out", type=Path, help="a new or empty directory (default: ./servestack-<digest prefix>)")
    p.add_argument("--bundle", help="sha256:... of one publication (default: the newest that verifies)")
    p.add_argument("--repository", help="the repository path the signature names, for a copy in another repository "
                                        "(default: the reference's own; the registry host never matters)")
    p.add_argument("--not-before", metavar="TIME", help="refuse publications signed before TIME (RFC 3339): no rollback")
    p.add_argument("--platform", help="for an image index: the platform whose manifest is checked (default: this "
                                      "machine's)")
    _timeout_arg(p)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


def _timeout_arg(p: argparse.ArgumentParser) -> None:
    from servestack.sources.registry import transfer

    p.add_argument("--timeout", type=_seconds, default=transfer.DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"give up on the registries after SECONDS in all (default {transfer.DEFAULT_TIMEOUT:g}); a "
                        f"response that stops for {transfer.STALL_SECONDS:g} s or falls under "
                        f"{transfer.MIN_RATE // 1024} KiB/s is a stall, named")


@command("pull", "verify an image's signed bundle and write its recipes, lock and results", _pull_args)
def _pull(args: argparse.Namespace, project: Project) -> int:
    from servestack import publish

    out = publish.pull(args.reference, key=args.key, out=args.out, bundle=args.bundle, repository=args.repository,
                       not_before_time=args.not_before, platform=args.platform, timeout=args.timeout)
    verdict = smoke_verdict(out / "build" / "smoke.json") if out is not None else None
    if verdict:
        console.result(verdict)
    return 0


def smoke_verdict(path: Path) -> str | None:
    """The published smoke's verdict with its counts, and whether serving ran at all: a PASS of the static
    probe alone (`smoke --no-serve`, or an arm64 image smoked on x86) is not a PASS of a server."""
    from servestack.records.smokefile import read_smoke

    if not path.is_file():
        return None
    smoke = read_smoke(path, shown=path)
    counts = ", ".join(f"{n} {status.replace('_', ' ')}" for status, n in smoke.counts().items())
    return (f"smoke of {smoke.image} ({smoke.platform}): {smoke.status.upper()} ({counts})"
            + ("" if smoke.served else "; serving did not run: the static probe alone"))


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("reference", help="REGISTRY/REPO@sha256:<64 hex>")
    p.add_argument("--key", type=Path, required=True, help="the publisher's public key (PEM)")
    p.add_argument("--rebuild", action="store_true", required=True,
                   help="rebuild from the bundle's lock and commit in a scratch worktree and compare digests")
    _timeout_arg(p)


@command("verify", "rebuild a published image from its signed lock and commit; same digest?", _verify_args)
def _verify(args: argparse.Namespace, project: Project) -> int:
    from servestack import publish

    return 0 if publish.verify_rebuild(project, args.reference, key=args.key, timeout=args.timeout)["same"] else 1


def _keygen_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key", type=Path, default=Path("servestack.key"),
                   help="private key path (mode 0600); the public key goes beside it as .pub")


@command("keygen", "make an ECDSA P-256 key pair for publish (private) and pull (public)", _keygen_args)
def _keygen(args: argparse.Namespace, project: Project) -> int:
    from servestack.publish import signing

    _refuse_committable(project, args.key)
    private, public = signing.keygen(args.key)
    console.result(f"wrote {private} (private, mode 0600: keep it out of the repository) and {public} (give this to pull)")
    return 0


def _refuse_committable(project: Project, key: Path) -> None:
    """A private key inside the checkout goes where .gitignore keeps it out of commits (`*.key` does),
    never to a path git would commit: refused before the key is made."""
    import subprocess

    from servestack.errors import InputError

    path = key.resolve()
    if not path.is_relative_to(project.root) or not (project.root / ".git").exists():
        return
    try:
        ignored = subprocess.run(["git", "-C", str(project.root), "check-ignore", "-q", str(path)],
                                 capture_output=True, timeout=30).returncode
    except OSError:  # no git here: nothing would commit it
        return
    if ignored == 1:
        raise InputError(key, "--key", "inside the repository and not covered by .gitignore (or tracked): git would "
                                       "commit the private key; choose a path outside the checkout or one ending in .key")
