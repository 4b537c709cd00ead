"""`containers/image.yaml`: what the image is made of, layer by layer, read into a typed plan.

The file is the readable definition of the image; `image.plan` turns it into concrete layers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from servestack.util import yamlfile
from servestack.util.yamlfile import UserModel

SOURCES = ("base", "venv", "packages", "model", "top", "prebuilt")


class LayerSource(UserModel):
    model_config = ConfigDict(populate_by_name=True)  # the file's `from:` may also be written `source:`

    source: Literal["base", "venv", "packages", "model", "top", "prebuilt"] = Field(alias="from")
    own_layer_above: int | None = Field(default=None, gt=0)
    shared_layers: int | None = Field(default=None, gt=0, le=64)

    @model_validator(mode="after")
    def _package_options(self) -> LayerSource:
        options = self.own_layer_above is not None or self.shared_layers is not None
        if self.source == "packages" and not (self.own_layer_above and self.shared_layers):
            raise ValueError("`from: packages` needs `own_layer_above` (bytes) and `shared_layers` (a count)")
        if self.source != "packages" and options:
            raise ValueError("`own_layer_above` and `shared_layers` apply to `from: packages` only")
        return self


class ImagePlan(UserModel):
    layers: list[LayerSource]
    max_layer_bytes: int = Field(gt=0)
    environment: dict[str, str] = {}

    @model_validator(mode="after")
    def _each_source_once(self) -> ImagePlan:
        names = [layer.source for layer in self.layers]
        if sorted(names) != sorted(SOURCES):
            raise ValueError(f"list each of {', '.join(SOURCES)} exactly once (got {', '.join(names)})")
        if names[0] != "base" or names[-2:] != ["top", "prebuilt"]:
            raise ValueError("the first layer is `from: base`, and the last two `from: top`, then `from: prebuilt` "
                             "(compiled inside the image made of every layer below it)")
        return self

    def source(self, name: str) -> LayerSource:
        return next(layer for layer in self.layers if layer.source == name)


def load_plan(file: Path) -> ImagePlan:
    """Read and validate the plan; every problem names file, line, column and field."""
    return yamlfile.load_model(file, ImagePlan, "a mapping with `layers`, `max_layer_bytes`, `environment`")
