"""The SBOM publish writes: SPDX 2.3 from the build record, the lock and the base's dpkg database,
validated by spdx-tools, and what pull refuses before it trusts one."""

from __future__ import annotations

import json
import zipfile
from dataclasses import replace

import pytest

from fixtures.paths import DATA
from fixtures.records import build_record, committed_lock
from servestack.errors import PublishError
from servestack.publish import sbom
from servestack.records.imageref import ImageRef
from servestack.records.lockfile import LocalPatch
from servestack.wheels import wheel_facts

IMAGE = ImageRef.parse("127.0.0.1:5000/servestack/dev-cpu@sha256:" + "ab" * 32)
CREATED = "2026-11-28T19:27:37Z"
STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc (2.36-9+deb12u14)
Version: 2.36-9+deb12u14
Description: GNU C Library
 shared libraries

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: base-files
Status: hold ok installed
Architecture: amd64
Version: 12.4+deb12u14
"""


def _lock(**changes):
    changes = {"pull_requests": (), **changes}
    return committed_lock(local_patches=(LocalPatch(package="patched", file="pins/patches/fix.diff", sha256="f" * 64, reason="why",
                                                    python_only=True, native_files=()),),
                          **changes)


def _document(base: sbom.BaseSystem | None = None, **lock_changes) -> dict:
    return json.loads(sbom.spdx_document("dev-cpu", IMAGE, build_record(), _lock(**lock_changes), base, CREATED))


def _packages(document: dict) -> dict[str, dict]:
    return {p["SPDXID"]: p for p in document["packages"]}


def _related(document: dict, kind: str) -> set[tuple[str, str]]:
    return {(r["spdxElementId"], r["relatedSpdxElement"]) for r in document["relationships"]
            if r["relationshipType"] == kind}


def test_the_dpkg_database_gives_every_installed_package_held_or_not_with_its_source_package():
    packages = sbom.parse_dpkg_status(STATUS)
    assert [(p.name, p.version, p.source, p.source_version) for p in packages] == [
        ("base-files", "12.4+deb12u14", "base-files", "12.4+deb12u14"),
        ("libc6", "2.36-9+deb12u14", "glibc", "2.36-9+deb12u14"),
    ]


def test_the_sbom_describes_the_image_by_digest_and_names_every_wheel_as_installed():
    document = _document()
    assert document["spdxVersion"] == "SPDX-2.3" and document["creationInfo"]["created"] == CREATED
    packages = _packages(document)
    assert ("SPDXRef-DOCUMENT", "SPDXRef-Image") in _related(document, "DESCRIBES")
    assert packages["SPDXRef-Image"]["checksums"] == [{"algorithm": "SHA256", "checksumValue": IMAGE.hex}]
    plain = packages["SPDXRef-pypi-plain-lib"]
    assert (plain["name"], plain["versionInfo"], plain["licenseDeclared"]) == ("plain-lib", "1.0", "MIT")
    assert plain["externalRefs"][0]["referenceLocator"] == "pkg:pypi/plain-lib@1.0"
    assert plain["downloadLocation"] == "NOASSERTION"  # where the index is, is configuration
    # Installed: the overlaid wheel, versioned and hashed as built; the published wheel it came from
    # is named beside it, not as something the image contains.
    patched = packages["SPDXRef-pypi-patched"]
    assert (patched["versionInfo"], patched["checksums"][0]["checksumValue"]) == ("3.1+ss.0123abcd", "c" * 64)
    assert patched["licenseDeclared"] == "NOASSERTION" and "BSD License" in patched["licenseComments"]
    assert ("SPDXRef-pypi-patched", "SPDXRef-pypi-upstream-patched") in _related(document, "GENERATED_FROM")
    assert sbom.python_distributions(document) == [("inner-dist", "2.0"), ("patched", "3.1+ss.0123abcd"),
                                                   ("patched-alias", "3.1"), ("plain-lib", "1.0")]


def test_every_patch_applied_is_named_with_its_hash_a_pr_by_its_diff_and_a_local_one_by_its_file():
    document = _document()
    packages = _packages(document)
    applied = {packages[a]["name"]: packages[a] for a, b in _related(document, "PATCH_APPLIED")
               if b == "SPDXRef-pypi-patched"}
    assert set(applied) == {"org/patched#7", "pins/patches/fix.diff"}
    assert applied["org/patched#7"]["downloadLocation"] == "https://github.com/org/patched/pull/7.diff"
    assert applied["pins/patches/fix.diff"]["checksums"][0]["checksumValue"] == "f" * 64


def test_pull_requests_already_in_a_release_are_said_on_the_wheel_that_contains_them():
    lock = committed_lock("qwen35-gb200")
    pr = next(p for p in lock.pull_requests if p.status == "included")
    document = _document(pull_requests=(replace(pr, package="plain-lib"),))
    assert f"{pr.repo}#{pr.number}" in _packages(document)["SPDXRef-pypi-plain-lib"]["comment"]


def test_the_base_s_debian_packages_sit_under_the_operating_system_with_scanner_package_urls():
    document = _document(sbom.BaseSystem(distro="debian", version="12.12", packages=sbom.parse_dpkg_status(STATUS)))
    packages = _packages(document)
    assert packages["SPDXRef-OperatingSystem"]["name"] == "debian"
    libc = packages["SPDXRef-deb-libc6-amd64"]
    assert libc["externalRefs"][0]["referenceLocator"] == \
        "pkg:deb/debian/libc6@2.36-9%2Bdeb12u14?arch=amd64&distro=debian-12.12"
    assert libc["sourceInfo"] == "built package from: glibc 2.36-9+deb12u14"
    assert ("SPDXRef-OperatingSystem", "SPDXRef-deb-libc6-amd64") in _related(document, "CONTAINS")
    assert ("SPDXRef-Image", "SPDXRef-OperatingSystem") in _related(document, "CONTAINS")


def test_an_ubuntu_base_s_packages_are_ubuntu_s():
    document = _document(sbom.BaseSystem(distro="ubuntu", version="24.04", packages=sbom.parse_dpkg_status(STATUS)))
    packages = _packages(document)
    assert packages["SPDXRef-OperatingSystem"]["name"] == "ubuntu"
    assert packages["SPDXRef-deb-libc6-amd64"]["externalRefs"][0]["referenceLocator"].startswith(
        "pkg:deb/ubuntu/libc6@2.36-9%2Bdeb12u14?arch=amd64&distro=ubuntu-24.04")


def test_a_base_without_a_dpkg_database_is_said_not_hidden():
    assert "no dpkg database" in _document(None)["comment"]


def test_the_same_inputs_give_the_same_bytes_on_every_machine_and_version():
    """Compared with a committed document: the bytes depend on the inputs only (not on servestack's
    version, nor on the machine), so republishing an image adds no second SBOM. When the document's
    form changes on purpose, regenerate tests/data/sbom-fixture.spdx.json."""
    written = sbom.spdx_document("dev-cpu", IMAGE, build_record(), _lock(), sbom.BaseSystem(
        distro="debian", version="12.12", packages=sbom.parse_dpkg_status(STATUS)), CREATED)
    assert written == (DATA / "sbom-fixture.spdx.json").read_bytes()


def test_names_that_fold_to_one_spdx_id_are_numbered_not_refused():
    record = build_record()
    twin = replace(record.inputs[0], name="plain.lib", filename="plain.lib-1.0-py3-none-any.whl", sha256="9" * 64)
    document = json.loads(sbom.spdx_document("dev-cpu", IMAGE, replace(record, inputs=(*record.inputs, twin)),
                                             _lock(), None, CREATED))
    ids = [p["SPDXID"] for p in document["packages"]]
    assert len(ids) == len(set(ids)) and "SPDXRef-pypi-plain-lib-2" in ids


def test_a_replaced_wheel_without_its_overlay_record_is_refused_naming_build_json():
    record = build_record()
    with pytest.raises(PublishError, match="build.json: patched-3.1-py3-none-any.whl is replaced by"):
        sbom.spdx_document("dev-cpu", IMAGE, replace(record, overlays=()), _lock(), None, CREATED)


def test_pull_refuses_an_sbom_for_another_image_or_one_that_is_not_valid_spdx():
    data = sbom.spdx_document("dev-cpu", IMAGE, build_record(), committed_lock(), None, CREATED)
    assert sbom.read_sbom(data, IMAGE, "t")["name"].endswith(IMAGE.digest)
    other = ImageRef.parse(IMAGE.name + "@sha256:" + "cd" * 32)
    with pytest.raises(PublishError, match="describes no package with the image's digest"):
        sbom.read_sbom(data, other, "bundle file sbom.spdx.json")
    broken = json.loads(data)
    broken["packages"][0]["SPDXID"] = "not an id"
    with pytest.raises(PublishError, match="bundle file sbom.spdx.json: not"):
        sbom.read_sbom(json.dumps(broken).encode(), IMAGE, "bundle file sbom.spdx.json")
    with pytest.raises(PublishError, match="not an SPDX JSON document"):
        sbom.read_sbom(b"{", IMAGE, "t")


def _wheel(tmp_path, metadata: str, vendored: dict[str, str] | None = None):
    path = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("demo-1.0.dist-info/METADATA", f"Metadata-Version: 2.4\nName: demo\nVersion: 1.0\n{metadata}\n")
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        for name, version in (vendored or {}).items():
            zf.writestr(f"demo/_vendor/{name}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n")
    return path


@pytest.mark.parametrize(("metadata", "expression", "words"), [
    ("License-Expression: mit OR Apache-2.0", "MIT OR Apache-2.0", "mit OR Apache-2.0"),
    ("License: BSD-3-Clause", "BSD-3-Clause", "BSD-3-Clause"),
    ("License: Copyright (c) 2005-2025, NumPy Developers.", None, "Copyright (c) 2005-2025, NumPy Developers."),
    ("Classifier: License :: OSI Approved :: BSD License", None, "OSI Approved :: BSD License"),
    ("License: Apache 2.0\nClassifier: License :: OSI Approved :: Apache Software License", None,
     "Apache 2.0; OSI Approved :: Apache Software License"),
    ("Summary: no licence said", None, None),
])
def test_a_wheel_s_licence_is_an_spdx_expression_only_where_its_metadata_gives_one(tmp_path, metadata, expression,
                                                                                    words):
    facts = wheel_facts(_wheel(tmp_path, metadata))
    assert (facts.license, facts.license_text) == (expression, words)


def test_a_wheel_names_the_distributions_it_vendors(tmp_path):
    facts = wheel_facts(_wheel(tmp_path, "License: MIT", {"Jaraco_Text": "3.12.1", "zipp": "3.19.2"}))
    assert facts.vendored == ("jaraco-text==3.12.1", "zipp==3.19.2")


def test_a_vendored_distribution_without_a_name_field_is_named_by_its_directory(tmp_path):
    path = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n")
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
        zf.writestr("demo/_vendor/six-1.16.0.dist-info/METADATA", "Metadata-Version: 2.1\n")
    assert wheel_facts(path).vendored == ("six==1.16.0",)


def test_a_licence_field_continued_over_a_blank_looking_line_keeps_the_fields_after_it(tmp_path):
    metadata = ("License: Copyright (c) the authors\n        \n        All rights reserved.\n"
                "Classifier: License :: OSI Approved :: MIT License")
    assert wheel_facts(_wheel(tmp_path, metadata)).license_text == "Copyright (c) the authors; OSI Approved :: MIT License"
