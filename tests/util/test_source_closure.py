"""The code that keys an image is found from the build and image steps' imports, not listed by hand."""

import shutil
from pathlib import Path

from servestack import inputs
from servestack.util import source_closure
from servestack.util.source_closure import closure, closure_hash

HOME = source_closure.HOME


def _files(roots: tuple[str, ...], home: Path = HOME) -> set[str]:
    return {p.relative_to(home).as_posix() for p in closure(roots, home=home).values()}


def test_the_image_steps_closure_holds_what_decides_bytes_and_nothing_that_serves():
    files = _files(inputs.IMAGE_STEPS)
    # The platform table writes every config's architecture and variant; the layer writer and the
    # script that compiles the prebuilt layer (run in the image, imported so the closure sees it).
    assert {"platforms.py", "image/layers.py", "image/oci.py", "probe/prebuild.py", "debian/rootfs.py",
            "inputs/overlay.py", "records/lockfile.py", "wheels/zipread.py"} <= files
    assert not {f for f in files if f.startswith(("smoke/", "publish/", "compare/", "stages/"))}
    assert "smoke/engine_settings.py" not in files  # serving flags re-key no image


def test_a_change_to_the_platform_table_moves_the_image_key(tmp_path):
    home = tmp_path / "servestack"
    shutil.copytree(HOME, home, ignore=shutil.ignore_patterns("__pycache__"))
    before = closure_hash(inputs.IMAGE_STEPS, home=home)
    assert before == closure_hash(inputs.IMAGE_STEPS)  # the copy is the same code
    table = home / "platforms.py"
    text = table.read_text()
    assert 'oci_variant="v8"' in text
    table.write_text(text.replace('oci_variant="v8"', 'oci_variant="v9"'))
    assert closure_hash(inputs.IMAGE_STEPS, home=home) != before


def test_a_serving_flag_re_keys_nothing(tmp_path):
    home = tmp_path / "servestack"
    shutil.copytree(HOME, home, ignore=shutil.ignore_patterns("__pycache__"))
    before = closure_hash(inputs.IMAGE_STEPS, home=home)
    settings = home / "smoke" / "engine_settings.py"
    settings.write_text(settings.read_text().replace('"generation-config": "vllm"', '"generation-config": "auto"'))
    assert closure_hash(inputs.IMAGE_STEPS, home=home) == before


def test_every_import_form_is_followed(tmp_path):
    home = tmp_path / "servestack"
    (home / "a" / "b").mkdir(parents=True)
    for name, text in {
        "__init__.py": "",
        "top.py": "def f():\n    from servestack.a.b import leaf  # inside a function\n",
        "a/__init__.py": "from . import sibling\n",
        "a/sibling.py": "import servestack.other\n",
        "a/b/__init__.py": "",
        "a/b/leaf.py": "from ..sibling import x\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from servestack import typed\n",
        "other.py": "",
        "typed.py": "",
        "unreached.py": "",
    }.items():
        (home / name).write_text(text)
    assert _files(("servestack.top",), home) == {
        "__init__.py", "top.py", "a/__init__.py", "a/sibling.py", "a/b/__init__.py", "a/b/leaf.py", "other.py", "typed.py"}
