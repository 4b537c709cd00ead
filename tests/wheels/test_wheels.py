from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

from fixtures.tinypkg import build_tinypkg
from servestack.errors import InputError
from servestack.wheels import (
    add_local_label,
    commit,
    overlay_label,
    pack_wheel,
    parse_wheel_filename,
    read_wheel,
    relabel_tree,
    unpack_wheel,
    verify_record,
    wheel_filename,
)
from servestack.wheels.commit import read_wheel_commit


def make_tree(root: Path, *, name: str = "demo", version: str = "0.31.0", files: dict[str, str] | None = None,
              tag: str = "py3-none-any") -> Path:
    files = files or {"demo/__init__.py": "X = 1\n", "demo/sub/mod.py": "Y = 2\n"}
    for path, text in files.items():
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    di = root / f"{name}-{version}.dist-info"
    di.mkdir(parents=True, exist_ok=True)
    (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nVersion: in the body stays\n")
    (di / "WHEEL").write_text(f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n")
    return root


# ------------------------------------------------------------------ names and labels


def test_local_label_composition():
    assert add_local_label("0.31.0", "ss.1a2b3c4d") == "0.31.0+ss.1a2b3c4d"
    assert add_local_label("2.13.0+cpu", "ss.1a2b3c4d") == "2.13.0+cpu.ss.1a2b3c4d"
    assert add_local_label("0.6.4.dev12+g1a2b3c4.d20240101", "ss.00ff00ff") == "0.6.4.dev12+g1a2b3c4.d20240101.ss.00ff00ff"
    assert overlay_label("ABCDEF0123456789") == "ss.abcdef01"
    with pytest.raises(ValueError):
        add_local_label("1.0", "not ok!")
    with pytest.raises(ValueError):
        add_local_label("1.0+", "ss.00000000")


def test_filenames():
    assert parse_wheel_filename("vllm-0.31.0-cp38-abi3-manylinux1_x86_64.whl") == ("vllm", "0.31.0", None, "cp38-abi3-manylinux1_x86_64")
    assert parse_wheel_filename("torch-2.13.0+cpu-1-cp311-cp311-linux_x86_64.whl")[1:3] == ("2.13.0+cpu", "1")
    assert wheel_filename("flashinfer-python", "0.2.0+ss.1a2b3c4d",
                          "py3-none-any") == "flashinfer_python-0.2.0+ss.1a2b3c4d-py3-none-any.whl"
    with pytest.raises(InputError):
        parse_wheel_filename("not-a-wheel.zip")


# ------------------------------------------------------------------ writing


def test_pack_is_deterministic_and_normalized(tmp_path):
    a = make_tree(tmp_path / "a")
    (a / "demo" / "tool.sh").write_text("#!/bin/sh\n")
    os.chmod(a / "demo" / "tool.sh", 0o700)
    os.chmod(a / "demo" / "__init__.py", 0o600)
    b = make_tree(tmp_path / "b")
    (b / "demo" / "tool.sh").write_text("#!/bin/sh\n")
    os.chmod(b / "demo" / "tool.sh", 0o755)
    os.utime(b / "demo" / "__init__.py", (1, 1))
    # a stale RECORD in the tree is ignored and regenerated
    (b / "demo-0.31.0.dist-info" / "RECORD").write_text("junk\n")

    wa = pack_wheel(a, tmp_path / "out-a", epoch=1_700_000_000)
    wb = pack_wheel(b, tmp_path / "out-b", epoch=1_700_000_000)
    assert wa.name == "demo-0.31.0-py3-none-any.whl"
    assert wa.read_bytes() == wb.read_bytes()
    assert pack_wheel(a, tmp_path / "out-c", epoch=1_800_000_000).read_bytes() != wa.read_bytes()

    with zipfile.ZipFile(wa) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        assert names == [
            "demo/__init__.py", "demo/sub/mod.py", "demo/tool.sh",
            "demo-0.31.0.dist-info/METADATA", "demo-0.31.0.dist-info/WHEEL", "demo-0.31.0.dist-info/RECORD",
        ]
        for i in infos:
            assert i.date_time == (2023, 11, 14, 22, 13, 20)
            assert i.extra == b"" and i.comment == b""
            assert i.create_system == 3
            assert (i.external_attr >> 16) == (0o100755 if i.filename.endswith(".sh") else 0o100644)
        assert zf.comment == b""
    assert verify_record(wa) == []


def test_epoch_is_clamped_to_1980(tmp_path):
    w = pack_wheel(make_tree(tmp_path / "t"), tmp_path / "out", epoch=0)
    with zipfile.ZipFile(w) as zf:
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_record_format_and_verification(tmp_path):
    w = pack_wheel(make_tree(tmp_path / "t"), tmp_path / "out", epoch=0)
    info = read_wheel(w)
    assert (info.name, info.version, info.tag, info.tags) == ("demo", "0.31.0", "py3-none-any", ("py3-none-any",))
    rec = {e.path: e for e in info.record}
    assert rec["demo-0.31.0.dist-info/RECORD"].hash == "" and rec["demo-0.31.0.dist-info/RECORD"].size is None
    import base64
    import hashlib

    expected = base64.urlsafe_b64encode(hashlib.sha256(b"X = 1\n").digest()).rstrip(b"=").decode()
    assert rec["demo/__init__.py"].hash == f"sha256={expected}" and rec["demo/__init__.py"].size == 6

    # a tampered member is caught
    bad = tmp_path / "bad" / w.name
    bad.parent.mkdir()
    with zipfile.ZipFile(w) as src, zipfile.ZipFile(bad, "w") as dst:
        for i in src.infolist():
            dst.writestr(i, b"X = 2\n" if i.filename == "demo/__init__.py" else src.read(i))
    problems = verify_record(bad)
    assert problems and "demo/__init__.py" in problems[0]


def test_relabel_renames_dist_info_data_and_metadata(tmp_path):
    root = make_tree(tmp_path / "t", name="torch", version="2.13.0+cpu", files={"torch/__init__.py": ""},
                     tag="cp311-cp311-linux_x86_64")
    (root / "torch-2.13.0+cpu.data" / "scripts").mkdir(parents=True)
    (root / "torch-2.13.0+cpu.data" / "scripts" / "torchrun").write_text("#!python\n")
    new = add_local_label("2.13.0+cpu", "ss.1a2b3c4d")
    assert relabel_tree(root, new) == "torch-2.13.0+cpu.ss.1a2b3c4d.dist-info"
    assert (root / "torch-2.13.0+cpu.ss.1a2b3c4d.data" / "scripts" / "torchrun").is_file()
    meta = (root / "torch-2.13.0+cpu.ss.1a2b3c4d.dist-info" / "METADATA").read_text()
    assert "\nVersion: 2.13.0+cpu.ss.1a2b3c4d\n" in meta and "Version: in the body stays" in meta
    w = pack_wheel(root, tmp_path / "out", epoch=0)
    assert w.name == "torch-2.13.0+cpu.ss.1a2b3c4d-cp311-cp311-linux_x86_64.whl"
    assert read_wheel(w).version == new
    assert verify_record(w) == []


def test_unpack_keeps_exec_bit_and_rejects_unsafe_paths(tmp_path):
    root = make_tree(tmp_path / "t")
    (root / "demo" / "run").write_text("#!/bin/sh\n")
    os.chmod(root / "demo" / "run", 0o755)
    w = pack_wheel(root, tmp_path / "out", epoch=0)
    dest = tmp_path / "x"
    unpack_wheel(w, dest)
    assert os.stat(dest / "demo" / "run").st_mode & 0o777 == 0o755
    assert os.stat(dest / "demo" / "__init__.py").st_mode & 0o777 == 0o644

    evil = tmp_path / "evil" / "demo-1.0-py3-none-any.whl"
    evil.parent.mkdir()
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../escape.py", "")
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        zf.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n")
    with pytest.raises(InputError, match="unsafe path"):
        unpack_wheel(evil, tmp_path / "y")
    assert not (tmp_path / "escape.py").exists()


# ------------------------------------------------------------------ recorded commit


def _wheel_with(tmp_path: Path, name: str, version: str, files: dict[str, str]) -> Path:
    return pack_wheel(make_tree(tmp_path / name, name=name, version=version, files=files), tmp_path / "out", epoch=0)


def test_commit_vllm_version_file(tmp_path):
    w = _wheel_with(tmp_path, "vllm", "0.6.4.dev12+g1a2b3c4d.d20240101", {
        "vllm/__init__.py": "",
        "vllm/_version.py": "__version__ = version = '0.6.4.dev12+g1a2b3c4d.d20240101'\n"
                            "__version_tuple__ = version_tuple = (0, 6, 4, 'dev12', 'g1a2b3c4d.d20240101')\n",
    })
    assert read_wheel_commit(w) == "1a2b3c4d"


def test_commit_vllm_commit_id_and_torch(tmp_path):
    sha = "0123456789abcdef0123456789abcdef01234567"
    w = _wheel_with(tmp_path, "vllm", "0.5.0", {
        "vllm/_version.py": "__version__ = version = '0.5.0'\n",
        "vllm/commit_id.py": f'__commit__ = "{sha}"\n',
    })
    assert read_wheel_commit(w) == sha
    t = _wheel_with(tmp_path, "torch", "2.5.0", {"torch/version.py": f"__version__ = '2.5.0'\ngit_version = '{sha}'\n"})
    assert read_wheel_commit(t) == sha


def test_commit_direct_url_and_unknown(tmp_path):
    root = make_tree(tmp_path / "d", name="demo", version="1.0", files={"demo/__init__.py": ""})
    (root / "demo-1.0.dist-info" / "direct_url.json").write_text(
        json.dumps({"url": "https://github.com/x/demo", "vcs_info": {"vcs": "git", "commit_id": "ABCDEF0123456"}})
    )
    assert read_wheel_commit(pack_wheel(root, tmp_path / "o1", epoch=0)) == "abcdef0123456"
    plain = _wheel_with(tmp_path, "plain", "1.0", {"plain/__init__.py": "", "plain/_version.py": "__version__ = '1.0'\n"})
    assert read_wheel_commit(plain) is None


def test_commit_table_is_pluggable(tmp_path, monkeypatch):
    w = _wheel_with(tmp_path, "odd", "1.0", {"odd/build_info.txt": "commit=feedbeefcafe\n"})
    assert read_wheel_commit(w) is None
    monkeypatch.setitem(commit.COMMIT_SOURCES, "odd", [("odd/build_info.txt", lambda t: t.split("=")[1].strip())])
    assert read_wheel_commit(w) == "feedbeefcafe"


def test_commit_of_tinyserve_fixture(tmp_path):
    pkg = build_tinypkg(tmp_path)
    commit = read_wheel_commit(pkg.wheel)
    assert commit and pkg.base.startswith(commit)
    assert verify_record(pkg.wheel) == []
