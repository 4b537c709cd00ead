"""Publish and pull when things go wrong or run together: tags, concurrent and interrupted publishes, secrets
kept out, several publications, the real image copied."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from fixtures import trixie_tools as tools
from fixtures.paths import ROOT
from fixtures.publication import STACK, make_project, new_image
from fixtures.tls_registry import push_stack_image
from servestack import inputs, publish
from servestack.errors import NetworkError, ServestackError
from servestack.publish import sbom, signing
from servestack.records.imageref import ImageRef
from servestack.sources.registry import OCI_MANIFEST, Client
from servestack.util.fsutil import atomic_write_json
from servestack.util.project import Project, state_home

pytestmark = pytest.mark.e2e


def test_pull_refuses_tags_and_a_missing_bundle(env, tmp_path):
    image, _ = new_image(env)
    key = signing.keygen(tmp_path / "k.key")[1]
    with pytest.raises(ServestackError, match="is a tag, not a digest"):
        publish.pull(image.split("@")[0] + ":1", key=key, out=tmp_path / "o")
    with pytest.raises(ServestackError, match="no signed publication"):
        publish.pull(image, key=key, out=tmp_path / "o")


def test_two_concurrent_publishes_keep_both_referrers(env, tmp_path, monkeypatch):
    """Both publishers read the empty index before either writes it; the one whose write is lost
    notices on its re-read and merges."""
    image, client = new_image(env)
    projects = []
    for name in ("a", "b"):
        project = make_project(tmp_path / name, image)
        run = project.artifacts(STACK) / "runs" / f"run-{name}" / "accuracy"
        atomic_write_json(run / "results.json", {"run": name})
        projects.append((project, f"run-{name}"))
    key = signing.keygen(tmp_path / "k.key")[0]
    barrier = threading.Barrier(2, timeout=30)
    writes: list[str] = []
    real_put = Client.put_manifest

    def racing_put(self, ref, data, media_type):
        if ref.startswith("sha256-"):
            writes.append(ref)
            if len(writes) <= 2:
                barrier.wait()  # both have read (and re-checked) the index before either writes
        return real_put(self, ref, data, media_type)

    monkeypatch.setattr(Client, "put_manifest", racing_put)
    results: dict[str, dict] = {}
    errors: list[BaseException] = []

    def run(project, run_id):
        try:
            results[run_id] = publish.publish(project, STACK, key=key, run_id=run_id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=p) for p in projects]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    referrers, where = client.referrers(ImageRef.parse(image).digest)
    listed = {r.digest for r in referrers}
    assert where == "tag"
    for record in results.values():
        assert record["bundle"].split("@")[1] in listed
        assert record["attestation"].split("@")[1] in listed
    assert len(writes) > 4  # the lost write was redone (4 entries, 4 writes without any race)


def test_registry_stopped_halfway_retries_then_fails_clearly_and_indexes_nothing_missing(env, tmp_path, monkeypatch):
    image, client = new_image(env)
    project = make_project(tmp_path / "checkout", image)
    key = signing.keygen(tmp_path / "k.key")[0]
    real_push = Client.push_blob
    pushed: list[int] = []

    def push_then_outage(self, data):
        pushed.append(len(data))
        if len(pushed) == 3:
            env.stop()  # the registry goes away in the middle of the upload
        return real_push(self, data)

    monkeypatch.setattr(Client, "push_blob", push_then_outage)
    real_init = Client.__init__
    monkeypatch.setattr(Client, "__init__", _fast_retries(real_init))
    try:
        with pytest.raises(NetworkError, match=r"upload blob .*could not reach registry .* after 4 attempts"):
            publish.publish(project, STACK, key=key)
    finally:
        env.start()
    monkeypatch.setattr(Client, "push_blob", real_push)
    monkeypatch.setattr(Client, "__init__", real_init)
    subject = ImageRef.parse(image).digest
    referrers, _ = client.referrers(subject)
    for referrer in referrers:  # whatever is indexed is complete
        manifest = json.loads(client.get_manifest(referrer.digest)[0])
        for blob in (manifest["config"], *manifest["layers"]):
            assert client.has_blob(blob["digest"])
    assert not (project.artifacts(STACK) / "publish.json").exists()
    record = publish.publish(project, STACK, key=key)  # and a rerun completes
    assert record["bundle"].split("@")[1] in {r.digest for r in client.referrers(subject)[0]}


def _fast_retries(init):
    def fast(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "retries": 3, "backoff": 0.2})
    return fast


def test_no_password_or_private_key_in_any_log_bundle_layer_or_record(env, tmp_path, registry):
    """The whole user path through the command line, verbose: copy the image into the TLS registry
    (with the login), publish, pull. Then search everything written for the secrets."""
    source_repository = f"servestack-test/publish-src-{uuid.uuid4().hex[:8]}"
    plain = Client(registry, source_repository)
    digest = push_stack_image(plain, (ROOT / "pins" / f"{STACK}.lock").read_bytes())
    image = f"{registry}/{source_repository}@{digest}"
    project = make_project(tmp_path / "checkout", image)
    keys = tmp_path / "keys"
    cli_env = {**os.environ, **env.environment(), "SERVESTACK_KEY_PASSWORD": "key-" + env.password[::-1]}
    logs = []

    def servestack(*args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "servestack", "-v", "--project", str(project.root), *args],
                              check=False, capture_output=True, text=True, env=cli_env, cwd=tmp_path)
        logs.append(done.stdout + done.stderr)
        assert done.returncode == 0, done.stdout + done.stderr

    servestack("keygen", "--key", str(keys / "publisher.key"))
    to = f"{env.address}/servestack-test/published-{uuid.uuid4().hex[:8]}"
    servestack("publish", "--stack", STACK, "--key", str(keys / "publisher.key"), "--to", to)
    servestack("pull", f"{to}@{digest}", "--key", str(keys / "publisher.pub"), "--out", str(tmp_path / "pulled"))
    assert Client(env.address, to.split("/", 1)[1]).get_manifest(digest) is not None  # the copy is there

    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key((keys / "publisher.key").read_bytes(),
                                                 password=cli_env["SERVESTACK_KEY_PASSWORD"].encode())
    unencrypted = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()).decode()
    secrets = {
        "password": env.password,
        "basic auth": json.loads((Path(env.environment()["DOCKER_CONFIG"]) / "config.json").read_text())["auths"][env.address]["auth"],
        "key password": cli_env["SERVESTACK_KEY_PASSWORD"],
        "private key (PEM body)": "".join(unencrypted.splitlines()[1:-1])[:64],
        "private key (encrypted file)": "".join((keys / "publisher.key").read_text().splitlines()[1:3]),
        "private scalar": format(private.private_numbers().private_value, "x"),
    }
    searched: list[tuple[str, bytes]] = [("command output", "".join(logs).encode())]
    for root in (env.storage, env.home / "registry", project.artifacts(STACK), tmp_path / "pulled"):
        for path in root.rglob("*"):
            if path.is_file():
                searched.append((str(path), path.read_bytes()))
    for path in (state_home() / "registry" / registry.rsplit(":", 1)[1]).rglob("*.log"):
        searched.append((str(path), path.read_bytes()))
    assert len(searched) > 20
    for what, secret in secrets.items():
        needle = secret.encode()
        leaks = [name for name, data in searched if needle in data]
        assert not leaks, f"the {what} appears in {leaks}"


def test_two_published_digests_are_compared_from_their_verified_bundles(env, tmp_path):
    """`compare A B` with two digests: each publication is pulled into a fresh directory, verified,
    and its run's results are the side; the slower image's regression is named at its point."""
    from dataclasses import replace

    from servestack.compare import comparisons
    from servestack.stages.results import StageResult, parse_vllm_result
    from servestack.stages.stage_report import write_run

    data = ROOT / "tests" / "data" / "dev-cpu"
    private, public = signing.keygen(tmp_path / "keys" / "publisher.key")
    images = []
    for label, factors in (("fast", (1.00, 1.03, 0.98)), ("slow", (0.70, 0.72, 0.69))):
        image, _ = new_image(env, salt=label)
        project = make_project(tmp_path / label, image)
        stage_dir = project.artifacts(STACK) / "runs" / label / "throughput"
        stage_dir.mkdir(parents=True)
        base = parse_vllm_result(data / "4.json", recipe="agg", gpus=1, concurrency=4)
        points = [replace(base, repeat=k, tokens_per_s_per_gpu=base.tokens_per_s_per_gpu * f) for k, f in enumerate(factors)]
        write_run(stage_dir.parent, [StageResult(stack=STACK, pipeline=STACK, stage="throughput", image=image, runner="local",
                                                 out_dir=stage_dir, throughput=points,
                                                 conditions={"agg": {"isl": 128, "osl": 32, "gpu_type": "cpu"}})])
        publish.publish(project, STACK, key=private, run_id=label)
        images.append(image)
    here = Project(root=tmp_path / "reader")
    result, report = comparisons.compare_references(here, STACK, images[0], images[1], key=public)
    assert [(ch.recipe, ch.concurrency, ch.metric) for ch in result.regressions] == [("agg", 4, "tokens_per_s_per_gpu")]
    out = report.parent
    for side in ("a", "b"):
        assert json.loads((out / "pulled" / side / "publication.json").read_text())["image"] in images
    assert f"image `{images[1]}`" in report.read_text()
    with pytest.raises(ServestackError):  # a key that did not sign them verifies nothing
        comparisons.compare_references(here, STACK, images[0], images[1],
                                       key=signing.keygen(tmp_path / "other.key")[1], out=tmp_path / "refused")


def test_of_three_publications_pull_takes_the_newest_in_every_index_order_and_a_replay_blocks_nothing(env, tmp_path):
    """One digest published three times (the build's, then two runs' results), and beside them a
    validly signed publication of another image replayed into its index: pull takes the newest
    whatever the index order, names the others with why, and the replay (its listing signed for the other
    image) is counted without a fetch and changes nothing."""
    import itertools

    from servestack.sources.registry import OCI_INDEX

    image, client = new_image(env)
    project = make_project(tmp_path / "checkout", image)
    private, public = signing.keygen(tmp_path / "keys" / "publisher.key")
    records = [publish.publish(project, STACK, key=private)]
    for run_id in ("run-1", "run-2"):
        stage = project.artifacts(STACK) / "runs" / run_id / "throughput"
        atomic_write_json(stage / "results.json", {"run": run_id})
        records.append(publish.publish(project, STACK, key=private, run_id=run_id))
    assert len({r["bundle"] for r in records}) == 3
    again = publish.publish(project, STACK, key=private, run_id="run-2")
    assert again["attestation"] == records[2]["attestation"]  # the same content again adds nothing

    other, other_client = new_image(env, salt="other")
    other_record = publish.publish(make_project(tmp_path / "other", other), STACK, key=private)
    replayed = other_record["attestation"].split("@")[1]
    other_manifest = other_client.get_manifest(replayed)[0]
    for layer in json.loads(other_manifest)["layers"] + [json.loads(other_manifest)["config"]]:
        client.push_blob(other_client.get_blob(layer["digest"]))
    client.put_manifest(replayed, other_manifest, OCI_MANIFEST)

    tag = client.fallback_tag(ImageRef.parse(image).digest)
    index = json.loads(client.get_manifest(tag)[0])
    attestations = [m for m in index["manifests"] if m.get("artifactType") == publish.bundle.ATTESTATION_TYPE]
    attestations.append({"mediaType": OCI_MANIFEST, "digest": replayed, "size": len(other_manifest),  # with its
                         "artifactType": publish.bundle.ATTESTATION_TYPE,  # signed listing, for the other image
                         "annotations": json.loads(other_manifest)["annotations"]})
    bundles = [m for m in index["manifests"] if m not in attestations]
    newest = records[2]["attestation"].split("@")[1]
    for n, order in enumerate(itertools.permutations(attestations)):  # the 24 orders of the four candidates
        if n % 5:  # every fifth (with the first and the reversed last): each candidate in each place
            continue
        client.put_manifest(tag, json.dumps({**index, "manifests": [*bundles, *order]}).encode(), OCI_INDEX)
        chosen = publish.fetch.fetch_publication(image, public)
        assert chosen.attestation_digest == newest, n
        assert len(chosen.skipped) == 3
        assert "1 attestation(s) whose listing this key did not sign" in chosen.skipped[0]  # never fetched
        assert sum("older than the one taken" in s for s in chosen.skipped) == 2
    out = publish.pull(image, key=public, out=tmp_path / "pulled")
    assert json.loads((out / "runs" / "run-2" / "throughput" / "results.json").read_text()) == {"run": "run-2"}


def test_publish_to_copies_the_real_dev_cpu_image_with_its_zstd_layers_and_it_pulls_back_verified(env, tmp_path):
    """`publish --to` on the image `nox -s image` made (Docker v2s2, zstd layers, 1 GB): every blob
    and the manifest's own bytes go to the TLS registry, and pull verifies it there, stack.json and all.
    Its SBOM, written from the lock and build.json, names exactly the Python distributions whose
    dist-info directories the layers hold (vendored ones too), and stock cosign verifies it."""
    from servestack import image, services

    services.ensure_dockerd()
    services.ensure_registry()
    repo = Project(root=ROOT)
    inputs.build(repo, STACK)  # seconds when nothing changed
    source = image.build_image(repo, STACK).reference
    project = make_project(tmp_path / "checkout", source)
    for name in ("build.json", "image.json"):
        shutil.copy(ROOT / "build" / STACK / name, project.artifacts(STACK) / name)
    private, public = signing.keygen(tmp_path / "keys" / "publisher.key")
    to = f"{env.address}/servestack-test/copied-{uuid.uuid4().hex[:8]}"
    record = publish.publish(project, STACK, key=private, to=to)
    copied = ImageRef.parse(record["image"])
    assert copied.digest == ImageRef.parse(source).digest and copied.name == to
    manifest = json.loads(Client(copied.registry, copied.repository).get_manifest(copied.digest)[0])
    assert any(layer["mediaType"].endswith("zstd") for layer in manifest["layers"])
    out = publish.pull(str(copied), key=public, out=tmp_path / "pulled")
    assert (out / "pins" / f"{STACK}.lock").read_bytes() == (ROOT / "pins" / f"{STACK}.lock").read_bytes()

    document = sbom.read_sbom((out / sbom.SBOM_TITLE).read_bytes(), copied, "pulled")
    in_layers = _dist_infos(Client(copied.registry, copied.repository), manifest)
    assert sbom.python_distributions(document) == in_layers
    debs = [p for p in document["packages"] if p["SPDXID"].startswith("SPDXRef-deb-")]
    assert {"libc6", "python3.11-minimal", "ca-certificates"} <= {p["name"] for p in debs}
    system = next(p for p in document["packages"] if p["SPDXID"] == "SPDXRef-OperatingSystem")
    assert system["name"] == "debian" and system["versionInfo"].startswith("12.")  # /etc/os-release is a symlink
    print(f"SBOM: {len(document['packages'])} packages: {len(in_layers)} Python distributions (as many dist-info "
          f"directories in the layers), {len(debs)} Debian packages")

    ca = Path(os.environ["SERVESTACK_CERTS_D"]) / copied.registry / "ca.crt"
    tool_env = {**os.environ, "HOME": str(tmp_path), "SSL_CERT_FILE": str(ca)}
    bom = subprocess.run([str(tools.trixie_tool("cosign")), "verify-attestation", "--key", str(public),
                          "--insecure-ignore-tlog", "--type", "spdxjson", str(copied)],
                         check=False, capture_output=True, text=True, env=tool_env, timeout=120)
    assert bom.returncode == 0, bom.stdout[-2000:] + bom.stderr
    tree = subprocess.run([str(tools.trixie_tool("oras")), "discover", "--ca-file", str(ca), "-o", "tree", str(copied)],
                          check=False, capture_output=True, text=True, env=tool_env, timeout=120)
    assert tree.returncode == 0 and sbom.SPDX_JSON in tree.stdout, tree.stderr
    print(tree.stdout)


def _dist_infos(client: Client, manifest: dict) -> list[tuple[str, str]]:
    """(normalized name, version) of every `*.dist-info/METADATA` in the image's layers, sorted."""
    import io
    import tarfile

    from servestack.publish.layerfiles import decompressed
    from servestack.wheels import normalize

    found = []
    for layer in manifest["layers"]:
        # A whole layer in memory is this test's choice; the declared size is its limit.
        blob = io.BytesIO(client.get_blob(layer["digest"], size=layer["size"], limit=layer["size"]))
        with tarfile.open(fileobj=decompressed(blob, layer["mediaType"]), mode="r|") as tar:
            for member in tar:
                matched = re.search(r"([^/]+)-([^/-]+)\.dist-info/METADATA$", member.name)
                if matched and member.isfile():
                    found.append((normalize(matched[1]), matched[2]))
    return sorted(found)
