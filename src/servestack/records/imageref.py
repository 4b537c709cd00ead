"""What an image reference is past the build: `[REGISTRY/]REPOSITORY@sha256:<64 hex>`, never a tag.

The one owner of that rule. Smoke, recipes, stages, runners and publish all parse through
`ImageRef.parse` (or ask `ImageRef.problem` when they collect several errors at once), so a
reference one step accepts is never refused by the next.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from servestack.errors import ImageRefError

_DIGEST_REFERENCE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._/:-]*[a-z0-9])@sha256:(?P<hex>[0-9a-f]{64})$")
EXPECTED = "repo@sha256:<64 lowercase hex>"


def split_registry(name: str) -> tuple[str | None, str]:
    """NAME's registry host[:port] (None when it has none, Docker Hub style) and the rest.

    Docker's rule: the first path component names a registry only if it has a dot or a port, or is
    localhost; `library/ubuntu` is a Hub repository, `127.0.0.1:5000/ubuntu` is not.
    """
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return None, name


def names_a_digest(text: str | None) -> bool:
    """Whether TEXT names an image by digest (`...@sha256:...`), well formed or not.

    What tells an image reference from a run id, a directory or a tag where a value may be any of
    them; `ImageRef.parse` then says whether it is a good one.
    """
    return "@sha256:" in (text or "")


@dataclass(frozen=True, kw_only=True)
class ImageRef:
    name: str  # registry host (when there is one) and repository, e.g. 127.0.0.1:5000/servestack/dev-cpu
    hex: str  # the manifest's sha256, 64 lowercase hex

    @classmethod
    def parse(cls, text: object) -> ImageRef:
        match = _DIGEST_REFERENCE.match(text) if isinstance(text, str) else None
        if match is None:
            raise ImageRefError(cls.problem(text) or f"expected an image reference {EXPECTED}")
        return cls(name=match["name"], hex=match["hex"])

    @staticmethod
    def problem(text: object) -> str | None:
        """None for a digest reference; otherwise what is wrong with TEXT, in one sentence."""
        if not isinstance(text, str) or not text:
            return f"expected an image reference {EXPECTED}"
        if _DIGEST_REFERENCE.match(text):
            return None
        if names_a_digest(text):
            return f"malformed digest reference {text!r}: expected {EXPECTED}"
        if "@" in text:
            return f"unsupported digest in {text!r}: expected {EXPECTED}"
        return (f"{text!r} is a tag, not a digest: tags move, so images are used by digest ({EXPECTED}; "
                "the digest is in build/<stack>/image.json)")

    @property
    def digest(self) -> str:
        return f"sha256:{self.hex}"

    @property
    def registry(self) -> str | None:
        return split_registry(self.name)[0]

    @property
    def repository(self) -> str:
        return split_registry(self.name)[1]

    @property
    def enroot(self) -> str:
        """The form pyxis hands to `enroot import`: the registry separated by '#'."""
        return f"{self.registry}#{self.repository}@{self.digest}" if self.registry else str(self)

    def __str__(self) -> str:
        return f"{self.name}@{self.digest}"
