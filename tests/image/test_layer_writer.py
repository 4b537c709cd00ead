"""The layer writer: deterministic tar + zstd, keyed by content, cached; the config and manifest."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest
import zstandard

from servestack.image import layers, oci
from servestack.util.fsutil import canonical_json
from servestack.util.progress import Progress, phase

EPOCH = 1_700_000_000


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESTACK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _tree(root, umask_mode=0o664, mtime=1):
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / "pkg" / "sub" / "big.bin").write_bytes(os.urandom(0) + bytes(range(256)) * 4096)
    (root / "pkg" / "run").write_text("#!/bin/sh\n")
    os.chmod(root / "pkg" / "run", 0o775)
    os.chmod(root / "pkg" / "__init__.py", umask_mode)
    (root / "pkg" / "link").symlink_to("sub/big.bin")
    for path in root.rglob("*"):
        os.utime(path, (mtime, mtime), follow_symlinks=False)
    return layers.scan_tree(root, "opt/venv/")


def test_the_same_files_give_the_same_blob_whatever_their_host_mode_and_mtime(tmp_path, cache):
    one = _tree(tmp_path / "a", umask_mode=0o664, mtime=1)
    two = _tree(tmp_path / "b", umask_mode=0o600, mtime=999_999)
    assert layers.layer_key(one, EPOCH) == layers.layer_key(two, EPOCH)
    first = layers.write_layer(one, EPOCH)
    first.path.unlink()  # force a second write from the other tree
    second = layers.write_layer(two, EPOCH)
    assert (first.digest, first.diff_id, first.size) == (second.digest, second.diff_id, second.size)
    assert "sha256:" + hashlib.sha256(second.path.read_bytes()).hexdigest() == second.digest


def test_the_tar_has_fixed_owner_modes_and_mtime_and_parents_first(tmp_path, cache):
    blob = layers.write_layer(_tree(tmp_path / "a"), EPOCH)
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob.path.read_bytes())).read()
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == blob.diff_id
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names[:3] == ["opt", "opt/venv", "opt/venv/pkg"]
    assert names == sorted(names)
    assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0, 0, "", "", EPOCH)}
    modes = {m.name.rsplit("/", 1)[-1]: (m.type, m.mode) for m in members}
    assert modes["__init__.py"] == (tarfile.REGTYPE, 0o644)
    assert modes["run"] == (tarfile.REGTYPE, 0o755)
    assert modes["sub"] == (tarfile.DIRTYPE, 0o755)
    assert modes["link"] == (tarfile.SYMTYPE, 0o777)


def test_a_changed_file_changes_the_key_and_a_known_key_is_not_written_again(tmp_path, cache):
    entries = _tree(tmp_path / "a")
    blob = layers.write_layer(entries, EPOCH)
    written = blob.path.stat().st_mtime_ns
    assert layers.write_layer(entries, EPOCH).path.stat().st_mtime_ns == written  # from the cache
    (tmp_path / "a" / "pkg" / "__init__.py").write_text("x = 2\n")
    changed = layers.scan_tree(tmp_path / "a", "opt/venv/")
    assert layers.layer_key(changed, EPOCH) != layers.layer_key(entries, EPOCH)
    assert layers.layer_key(entries, EPOCH + 1) != layers.layer_key(entries, EPOCH)


def test_the_key_hashes_each_entry_as_its_json_line(tmp_path):
    """Layer keys name cached blobs on every machine: the key is the recipe's canonical JSON, then one
    json.dumps(identity) line per member; names that JSON escapes included."""
    odd = ['quote"', "back\\slash", "new\nline", "tab\tcontrol\x01", "caf\u00e9", "emoji\U0001f600",
           os.fsdecode(b"latin1-\xe9"), "slash/\u2028"]
    entries = [layers.Entry(path=f"opt/{name}", kind="file", mode=0o644, size=2 ** 40 + n, sha256="ab" * 32) for n, name in enumerate(odd)]
    entries += [layers.Entry(path=f"opt/link-{n}", kind="symlink", mode=0o777, link=name) for n, name in enumerate(odd)]
    recipe = {"tar": layers.TAR_RECIPE, "epoch": EPOCH, "zstd_level": layers.ZSTD_LEVEL, "zstd": zstandard.ZSTD_VERSION}
    lines = [json.dumps([e.path, e.kind, e.mode, e.size, e.sha256, e.link]) + "\n" for e in layers.with_parents(entries)]
    expected = hashlib.sha256((canonical_json(recipe) + "".join(lines)).encode())
    assert layers.layer_key(entries, EPOCH) == expected.hexdigest()


def _named(length: int, filler: str = "n") -> str:
    """A relative path whose entry path (with the "opt/venv/" prefix) is `length` characters long,
    in components of at most 200 characters."""
    left, parts = length - len("opt/venv/"), []
    while left > 201:
        parts.append(filler * 200)
        left -= 201
    return "/".join(parts + [filler * left])


def test_the_tar_size_known_in_advance_is_the_bytes_the_layer_writer_tars(tmp_path, cache):
    """The progress line's total ("tarred 0.59 GB of 0.55 GB" when it was the files' bytes alone):
    headers, pax headers for long and non-ASCII names, padding and the end blocks, counted exactly."""
    root = tmp_path / "t"
    root.mkdir()
    _tree(root)
    contents = {"empty": b"", "one-block": b"x" * 512, "just-over": b"x" * 513, "caf\u00e9.py": b"accent\n",
                # Not UTF-8: tarfile adds a hdrcharset=BINARY record, here pushing the records past 512 bytes.
                _named(480) + "/" + os.fsdecode(b"\xe9.py"): b"not utf-8\n"}
    # Around the 100-character ustar limit (a directory's path gets a "/"), and around where a pax
    # record's length grows from three digits to four.
    for length in (99, 100, 101, 988, 989, 991):
        contents[_named(length)] = b"y"
    for name, data in contents.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / _named(100, "d")).mkdir()
    (root / _named(100, "d") / "f").write_bytes(b"z")
    (root / "long-link").symlink_to("t" * 101)
    # A path record of 1001 bytes (its length's digits carry to four) and a link record of 24: 1025
    # bytes, one over two blocks, so a length one short would be seen.
    (root / _named(990)).symlink_to("\u00e9" + "x" * 9)
    entries = layers.scan_tree(root, "opt/venv/")
    assert any(len(e.path) == 990 for e in entries)
    written = io.BytesIO()
    layers.write_tar(entries, written, EPOCH)
    with tarfile.open(fileobj=io.BytesIO(written.getvalue())) as tar:
        members = tar.getmembers()
    # Each member from where its (extended) header starts to where the next one's does: the end
    # padding alone would hide a header miscounted by less than 10 KB.
    ends = [m.offset for m in members[1:]] + [members[-1].offset_data + -(-members[-1].size // 512) * 512]
    spans = {m.name: end - m.offset for m, end in zip(members, ends, strict=True)}
    assert spans == {e.path: layers.tar_member_size(e) for e in layers.with_parents(entries)}
    assert layers.tar_size(entries) == len(written.getvalue()) == layers.write_layer(entries, EPOCH).uncompressed
    assert layers.tar_size(entries) > sum(e.size for e in entries)


def _tarfile_tar(entries: list[layers.Entry], epoch: int) -> bytes:
    """The reference for write_tar: the same members through tarfile's PAX_FORMAT (how the layers were
    written before TAR_RECIPE 1's tar got its own writer; the pinned image digests depend on these bytes)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in layers.with_parents(entries):
            tar.addfile(_tarinfo(e, epoch), io.BytesIO(layers.content(e)) if e.kind == "file" else None)
    return out.getvalue()


def _tarinfo(e: layers.Entry, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(e.path)
    info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = e.mode, epoch, 0, 0, "", ""
    if e.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif e.kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, e.link
    else:
        info.size = e.size
    return info


def _written(entries: list[layers.Entry]) -> bytes:
    out = io.BytesIO()
    layers.write_tar(entries, out, EPOCH)
    return out.getvalue()


def test_the_layer_writer_writes_what_tarfile_writes_byte_for_byte(tmp_path):
    """Every kind of member the writer must get right, each alone (so a failure names it) and all in
    one tar (so the stream's record padding and chunking are checked too)."""
    root = tmp_path / "t"
    files = {"empty": b"", "one-block": b"x" * 512, "just-over": b"x" * 513,
             "large.bin": os.urandom(3 * layers._Chunks.CHUNK + 7),  # several chunks, the last one partial
             "caf\u00e9/na\u00efve.py": b"accent\n", _named(100): b"fits", _named(101): b"long", _named(300): b"longer",
             os.fsdecode(b"latin1-\xe9.py"): b"not utf-8\n", _named(120) + "/" + os.fsdecode(b"\xff"): b"both\n"}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "run").write_bytes(b"#!/bin/sh\n")
    os.chmod(root / "run", 0o775)
    (root / "short-link").symlink_to("large.bin")
    (root / "long-link").symlink_to("t" * 101)
    (root / "accent-link").symlink_to("caf\u00e9/na\u00efve.py")
    entries = layers.scan_tree(root, "opt/venv/") + [
        layers.Entry(path="opt/venv/empty-dir", kind="dir", mode=0o755),
        layers.Entry(path=_named(100, "d"), kind="dir", mode=0o755),  # 101 characters with its "/": a pax path
        layers.Entry(path="opt/venv/\u00e9t\u00e9", kind="dir", mode=0o755)]
    assert {e.mode for e in entries if e.kind == "file"} == {0o644, 0o755}
    for e in entries:
        assert _written([e]) == _tarfile_tar([e], EPOCH), e.path
    assert _written(entries) == _tarfile_tar(entries, EPOCH)


def test_files_are_read_from_their_tree_pack_at_their_offset(tmp_path):
    """An installed tree keeps its files in one pack (trees.py); the writer reads each from its offset."""
    pack = tmp_path / "pack"
    contents = [b"first\n", b"", os.urandom(layers._Chunks.CHUNK + 1), b"last"]
    pack.write_bytes(b"".join(contents))
    entries, offset = [], 0
    for n, data in enumerate(contents):
        entries.append(layers.Entry(path=f"opt/f{n}", kind="file", mode=0o644, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                                    source=pack, offset=offset))
        offset += len(data)
    assert _written(entries) == _tarfile_tar(entries, EPOCH)
    with tarfile.open(fileobj=io.BytesIO(_written(entries))) as tar:
        assert [tar.extractfile(f"opt/f{n}").read() for n in range(len(contents))] == contents


def test_a_pack_shorter_than_its_entry_says_which_file_and_entry(tmp_path):
    pack = tmp_path / "pack"
    pack.write_bytes(b"12345")
    with pytest.raises(ValueError, match=f"{pack} at 2 \\(for opt/f\\): ends 7 bytes short"):
        _written([layers.Entry(path="opt/f", kind="file", mode=0o644, size=10, sha256="", source=pack, offset=2)])


@pytest.mark.parametrize("size", [8 ** 11 - 1, 8 ** 11, 2 ** 40 + 3])
def test_a_size_past_eleven_octal_digits_goes_in_a_pax_header_as_tarfile_puts_it(size):
    """No test writes a 8 GB file: the header alone is compared, and its length with tar_member_size."""
    e = layers.Entry(path="opt/venv/model.safetensors", kind="file", mode=0o644, size=size)
    header = layers.tar_header(e, EPOCH)
    assert header == _tarinfo(e, EPOCH).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    assert len(header) == (3 if size >= 8 ** 11 else 1) * 512
    assert layers.tar_member_size(e) == len(header) + -(-size // 512) * 512


def test_parent_directories_are_added_once_and_before_their_contents():
    entries = [layers.Entry(path="a/b/c/f", kind="file", mode=0o644), layers.Entry(path="a/b/g", kind="symlink", mode=0o777, link="c"),
               layers.Entry(path="a/b", kind="dir", mode=0o700), layers.Entry(path="z", kind="file", mode=0o644)]
    members = layers.with_parents(entries)
    assert [(e.path, e.kind, e.mode) for e in members] == [
        ("a", "dir", 0o755), ("a/b", "dir", 0o700), ("a/b/c", "dir", 0o755), ("a/b/c/f", "file", 0o644),
        ("a/b/g", "symlink", 0o777), ("z", "file", 0o644)]
    assert layers.with_parents(members) is members  # keyed, sized and written from one computation


def test_entries_saved_beside_a_tree_load_back_equal(tmp_path):
    entries = _tree(tmp_path / "a")
    layers.save_entries(tmp_path / "entries.json", entries, tmp_path / "a")
    assert layers.load_entries(tmp_path / "entries.json", tmp_path / "a") == entries


def test_config_and_manifest_are_docker_schema2_with_zstd_layers_and_stable_bytes():
    refs = [oci.LayerRef(name="base", digest="sha256:" + "1" * 64, diff_id="sha256:" + "2" * 64, size=10),
            oci.LayerRef(name="top", digest="sha256:" + "3" * 64, diff_id="sha256:" + "4" * 64, size=20)]
    config = oci.config("linux/arm64", refs, {"PATH": "/opt/venv/bin:/usr/bin", "A": "b"}, {"l": "v"}, EPOCH)
    body = json.loads(config.data)
    assert body["architecture"] == "arm64" and body["variant"] == "v8"
    assert body["rootfs"]["diff_ids"] == ["sha256:" + "2" * 64, "sha256:" + "4" * 64]
    assert body["config"]["Env"] == ["PATH=/opt/venv/bin:/usr/bin", "A=b"]
    manifest = oci.manifest(config, refs)
    doc = json.loads(manifest.data)
    assert doc["mediaType"] == oci.MANIFEST_TYPE == "application/vnd.docker.distribution.manifest.v2+json"
    assert {layer["mediaType"] for layer in doc["layers"]} == {"application/vnd.oci.image.layer.v1.tar+zstd"}
    assert doc["config"] == {"mediaType": oci.CONFIG_TYPE, "digest": config.digest, "size": len(config.data)}
    again = oci.manifest(oci.config("linux/arm64", refs, {"PATH": "/opt/venv/bin:/usr/bin", "A": "b"}, {"l": "v"}, EPOCH), refs)
    assert again.digest == manifest.digest


def test_progress_prints_periodic_plain_lines_off_a_terminal():
    out = io.StringIO()
    with Progress("image s", ("tarred", "pushed"), total=2_000_000_000, stream=out, live=False, interval=0.05) as p:
        p.set_step("layer 1 of 2: base")
        p.add("tarred", 500_000_000)
        import time

        time.sleep(0.2)
    lines = out.getvalue().splitlines()
    assert lines and "\r" not in out.getvalue()
    assert lines[-1].startswith("image s: layer 1 of 2: base | tarred 0.50 GB of 2.00 GB, pushed 0.0 MB")


def test_bytes_found_to_be_needed_on_the_way_join_the_total():
    """The Debian base is compressed in the layer step only when EarlyLayers did not do it first."""
    out = io.StringIO()
    with Progress("image s", ("tarred",), total=300_000_000, stream=out, live=False, interval=60) as p:
        p.expect(200_000_000)
        p.add("tarred", 500_000_000)
    assert out.getvalue().splitlines()[-1].startswith("image s: tarred 0.50 GB of 0.50 GB")


def test_a_phase_says_when_it_starts_ends_or_fails():
    out = io.StringIO()
    with phase("smoke s", "static probe", stream=out):
        pass
    with pytest.raises(RuntimeError), phase("smoke s", "serving probe", stream=out):
        raise RuntimeError("x")
    assert out.getvalue().splitlines() == ["smoke s: static probe ...", "smoke s: static probe done (0 s)",
                                           "smoke s: serving probe ...", "smoke s: serving probe failed after 0 s"]
