"""`publish --to` and `nox -s outputs` agree on where the image is (issue 53): the workflows hand the
`<stack>-image` output to the cluster job, which pulls it, so it names the published copy."""

from __future__ import annotations

import json

from fixtures.records import write_image_record
from servestack import ci
from servestack.util.project import Project

BUILT = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "a" * 64
COPY = "registry.example:443/team/dev-cpu@sha256:" + "a" * 64
OTHER = "registry.example:443/team/dev-cpu@sha256:" + "c" * 64


def test_outputs_name_the_copy_publish_to_made_and_never_another_image(tmp_path):
    project = Project(root=tmp_path)
    out = tmp_path / "build" / "dev-cpu"
    out.mkdir(parents=True)
    write_image_record(out / "image.json", BUILT, "dev-cpu")
    assert ci.step_outputs(project, "dev-cpu") == {"dev-cpu-image": BUILT}
    (out / "publish.json").write_text(json.dumps({"image": COPY, "bundle_digest": "sha256:" + "b" * 64}))
    assert ci.step_outputs(project, "dev-cpu") == {"dev-cpu-image": COPY, "dev-cpu-bundle": "sha256:" + "b" * 64}
    # A publication of an earlier build (another digest) does not move the output off this build.
    (out / "publish.json").write_text(json.dumps({"image": OTHER, "bundle_digest": "sha256:" + "b" * 64}))
    assert ci.step_outputs(project, "dev-cpu")["dev-cpu-image"] == BUILT
