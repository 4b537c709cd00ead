"""Past the build, an image is named by digest: `[REGISTRY/]REPOSITORY@sha256:<64 hex>`, never a tag."""

from __future__ import annotations

import pytest

from servestack.errors import ImageRefError
from servestack.records.imageref import ImageRef, names_a_digest

HEX = "ab" * 32


@pytest.mark.parametrize("text", ["127.0.0.1:5000/servestack/dev-cpu:latest", "servestack/dev-cpu", "servestack/dev-cpu:0.1"])
def test_a_tag_is_refused_saying_tags_move(text):
    with pytest.raises(ImageRefError, match=rf"{text!r} is a tag, not a digest: tags move"):
        ImageRef.parse(text)


@pytest.mark.parametrize("text", ["127.0.0.1:5000/x@sha256:ABC", f"x@sha256:{HEX.upper()}", f"x@sha256:{HEX}0"])
def test_a_malformed_digest_is_refused(text):
    with pytest.raises(ImageRefError, match="malformed digest reference"):
        ImageRef.parse(text)


def test_another_digest_algorithm_is_refused():
    assert "unsupported digest" in ImageRef.problem("x@sha512:" + "a" * 128)


@pytest.mark.parametrize("text", [None, "", 7])
def test_a_missing_reference_says_what_was_expected(text):
    assert ImageRef.problem(text) == "expected an image reference repo@sha256:<64 lowercase hex>"


def test_a_digest_reference_splits_into_registry_repository_and_digest():
    ref = ImageRef.parse(f"127.0.0.1:5000/servestack/dev-cpu@sha256:{HEX}")
    assert (ref.registry, ref.repository, ref.digest) == ("127.0.0.1:5000", "servestack/dev-cpu", f"sha256:{HEX}")
    assert str(ref) == f"127.0.0.1:5000/servestack/dev-cpu@sha256:{HEX}"


@pytest.mark.parametrize(("text", "enroot"), [
    (f"nvcr.io/nvidia/vllm@sha256:{HEX}", f"nvcr.io#nvidia/vllm@sha256:{HEX}"),
    (f"localhost/x@sha256:{HEX}", f"localhost#x@sha256:{HEX}"),
    (f"library/x@sha256:{HEX}", f"library/x@sha256:{HEX}"),
])
def test_enroot_separates_the_registry_with_a_hash(text, enroot):
    assert ImageRef.parse(text).enroot == enroot


@pytest.mark.parametrize(("text", "by_digest"), [
    (f"127.0.0.1:5000/x@sha256:{HEX}", True), ("x@sha256:ABC", True),  # malformed, still meant by digest: parse says why
    ("20260101-120000", False), ("runs/20260101-120000", False), ("x:latest", False), (f"sha256:{HEX}", False), (None, False),
])
def test_a_value_names_an_image_by_digest_only_with_an_at_sha256(text, by_digest):
    assert names_a_digest(text) is by_digest
