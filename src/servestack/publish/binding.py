"""Every recipe a publication carries must run the image it was published with.

A recipe is bound when servestack renders it: `model.container` and `identity.container.image`
name the image by digest, and the header records the image and the lock's sha256. The signature
covers the recipe's bytes, not what they say, so a bundle signed with the right key could still
carry a recipe that runs another image (a digest, a registry path, or a tag). Pull reads each one
and refuses the publication unless all of them name the pulled image's repository path and digest
(the registry host is not compared, as in the signature: a mirror serves the same digest under
another host) and record the bundle lock's sha256.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from servestack.errors import PublishError
from servestack.publish.bundle import BundleFile
from servestack.records.imageref import ImageRef

RECIPES = "recipes/"
_HEADER = re.compile(r"^# (image|lock-sha256): (.*?)\s*$", re.M)


@dataclass(frozen=True, kw_only=True)
class Binding:
    """What one recipe says it runs."""

    title: str
    references: tuple[str, ...]  # model.container, identity.container.image, the header's image
    lock_sha256: str | None


def _section(mapping: dict[str, Any], key: str) -> dict[str, Any]:
    value = mapping.get(key)
    return value if isinstance(value, dict) else {}


def binding(recipe: BundleFile) -> Binding:
    text = recipe.data.decode("utf-8", "replace")
    header = dict(_HEADER.findall("".join(line + "\n" for line in text.splitlines() if line.startswith("#"))))
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    document: dict[str, Any] = value if isinstance(value, dict) else {}
    model, identity = _section(document, "model"), _section(document, "identity")
    container = _section(identity, "container")
    references = (model.get("container"), container.get("image"), header.get("image"))
    return Binding(title=recipe.title, references=tuple(str(r) for r in references), lock_sha256=header.get("lock-sha256"))


def check_bindings(files: tuple[BundleFile, ...], identity: str, lock_sha256: str) -> int:
    """IDENTITY is `repository@sha256:...` as the signature names it. Returns how many recipes were
    checked; raises PublishError naming the first recipe that binds anything else."""
    recipes = [f for f in files if f.title.startswith(RECIPES)]
    for recipe in recipes:
        bound = binding(recipe)
        for reference in bound.references:
            if _identity(reference) != identity:
                raise PublishError(f"{recipe.title} binds {reference[:200]!r}, not {identity}")
        if bound.lock_sha256 != lock_sha256:
            raise PublishError(f"{recipe.title} records lock-sha256 {str(bound.lock_sha256)[:80]!r}, the bundle's lock "
                               f"is {lock_sha256}")
    return len(recipes)


def _identity(reference: str) -> str | None:
    """`repository@digest` of a digest reference; None for a tag or anything unparsable."""
    if ImageRef.problem(reference):
        return None
    image = ImageRef.parse(reference)
    return f"{image.repository}@{image.digest}"
