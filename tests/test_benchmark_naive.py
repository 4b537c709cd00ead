"""The naive benchmark build prunes the BuildKit cache records it made, leaves first, and no one else's."""

from __future__ import annotations

import importlib.util
import sys

from fixtures.paths import ROOT

# The script imports its sibling modules as `python benchmarks/build.py` would find them.
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("benchmark_build", ROOT / "benchmarks" / "build.py")
benchmark = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(benchmark)


def _record(id_: str, kind: str, description: str, parent: str = "") -> dict:
    return {"ID": id_, "CacheType": kind, "Description": description, "Parent": parent}


# As `docker system df -v` listed them around a build of a Dockerfile shaped like benchmarks/naive/Dockerfile.
BEFORE = [_record("slot", "source.local", "local source for context"),  # the slot default-config builds reuse
          _record("older", "regular", "[1/1] COPY hello.txt /hello.txt")]
NAIVE = [_record("copy", "regular", "[stage-0 3/3] COPY model/ /opt/m/", "run"),
         _record("ctx", "source.local", "local source for context"),
         _record("run", "regular", "mount / from exec /bin/sh -c pip install /wheels/*.whl", "add"),
         _record("dockerfile", "source.local", "local source for dockerfile"),
         _record("add", "regular", "[stage-0 1/3] ADD rootfs.tar /")]
MEANWHILE = [_record("theirs", "regular", "[1/2] COPY hello.txt /hello.txt"),  # another build during ours
             _record("theirs-run", "regular", "mount / from exec /bin/sh -c true", "theirs")]


def test_the_naive_build_records_are_pruned_leaves_first_and_no_others():
    after = {r["ID"]: r for r in BEFORE + NAIVE + MEANWHILE}
    order = benchmark.naive_records({r["ID"] for r in BEFORE}, after)
    assert sorted(order) == sorted(r["ID"] for r in NAIVE)
    assert order.index("copy") < order.index("run") < order.index("add")  # a parent only once its child is gone
