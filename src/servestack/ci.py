"""What a CI workflow takes from finished steps: digests as step outputs, records as a summary.

GitHub Actions gives every step two files: `$GITHUB_OUTPUT` (`name=value` lines, which the job's
`outputs:` read, and which is how a digest reaches a dependent job or workflow) and
`$GITHUB_STEP_SUMMARY` (Markdown shown on the run's page). `step_outputs` and `summary` only read
the step records and return data; `write_step` appends to those files, or prints when the
process is not a workflow step.

Output names carry the stack (`dev-cpu-image`, `qwen35-gb200-bundle`) so the legs of a matrix job
never overwrite each other's outputs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from servestack.errors import ServestackError
from servestack.records.imageref import ImageRef
from servestack.records.smokefile import read_smoke
from servestack.records.steps import read_image
from servestack.util.console import console
from servestack.util.project import Project

_OUTPUT_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def _record(project: Project, stack: str, name: str) -> dict[str, Any] | None:
    path = project.artifacts(stack) / name
    return project.read_json(path, "") if path.exists() else None


def step_outputs(project: Project, stack: str) -> dict[str, str]:
    """`<stack>-image` (REPO@sha256:...: the published copy when publish.json records one of this image)
    and `<stack>-bundle` (sha256:...) for the steps that ran.

    A reference that is not by digest is refused here too: no tag ever becomes an output.
    """
    outputs: dict[str, str] = {}
    image = project.artifacts(stack) / "image.json"
    publication = _record(project, stack, "publish.json")
    if image.exists():
        record = read_image(image, shown=image.relative_to(project.root))
        built = ImageRef.parse(record.reference)
        outputs[f"{stack}-image"] = str(built)
        # Where `publish --to` copied this image (or its index), the published copy is where the steps
        # after it find the image and its bundle: the cluster job pulls that, not the build registry's.
        published = publication.get("image") if publication else None
        if published and ImageRef.parse(published).digest in (built.digest, record.index):
            outputs[f"{stack}-image"] = str(ImageRef.parse(published))
    if publication is not None:
        outputs[f"{stack}-bundle"] = str(publication["bundle_digest"])
    return outputs


def summary(project: Project, stack: str, run_id: str | None = None) -> str:
    """Markdown: the image by digest, the smoke verdict, the bundle, then each stage report of the run."""
    lines = [f"## {stack}", ""]
    outputs = step_outputs(project, stack)
    lines.append(f"- image: `{outputs.get(f'{stack}-image', 'not built')}`")
    smoke_json = project.artifacts(stack) / "smoke.json"
    if smoke_json.exists():
        smoke = read_smoke(smoke_json, shown=smoke_json.relative_to(project.root))
        lines.append(f"- smoke: **{smoke.status.upper()}** (" +
                     ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in smoke.counts().items()) + ")")
    lines.append(f"- bundle: `{outputs.get(f'{stack}-bundle', 'not published')}`")
    if run_id:
        run_dir = project.artifacts(stack) / "runs" / run_id
        # The run's own report (pipeline) covers every stage; a single-stage session writes only its stage's.
        reports = [run_dir / "report.md"] if (run_dir / "report.md").exists() else sorted(run_dir.glob("*/report.md"))
        lines += ["", f"### run {run_id}", ""]
        if not reports:
            lines.append(f"no stage report under {run_dir.relative_to(project.root)}")
        for report in reports:
            lines += [report.read_text().rstrip(), ""]
        plots = sorted(p.relative_to(run_dir) for p in run_dir.glob("*/*.png"))
        if plots:
            lines.append("Plots (in the run's artifact): " + ", ".join(f"`{p}`" for p in plots))
    return "\n".join(lines).rstrip() + "\n"


def write_step(outputs: dict[str, str], markdown: str, environ: dict[str, str] | None = None) -> None:
    """Append outputs to $GITHUB_OUTPUT and the Markdown to $GITHUB_STEP_SUMMARY, where set."""
    env = os.environ if environ is None else environ
    for name, value in outputs.items():
        # One line per value: a newline would let a value forge another output.
        if not _OUTPUT_NAME.match(name) or "\n" in value or "\r" in value:
            raise ServestackError(f"step output {name!r}={value!r}: names are [A-Za-z0-9_-], values one line")
    if env.get("GITHUB_OUTPUT"):
        with Path(env["GITHUB_OUTPUT"]).open("a", encoding="utf-8") as f:
            f.writelines(f"{name}={value}\n" for name, value in outputs.items())
    if env.get("GITHUB_STEP_SUMMARY"):
        with Path(env["GITHUB_STEP_SUMMARY"]).open("a", encoding="utf-8") as f:
            f.write(markdown + "\n")
    elif not env.get("GITHUB_ACTIONS"):
        console.result(markdown.removesuffix("\n"))
