"""The stack file, `pins/<stack>.yaml`: what a serving stack is.

A stack names its target platforms, its base image, its Python, the packages it installs (each
from a package index or a git commit), the upstream pull requests each package must contain,
environment defaults baked into the image, and the model the smoke stage serves.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import Field, field_validator, model_validator

from servestack import platforms
from servestack.util import yamlfile
from servestack.util.yamlfile import UserModel, exactly_one
from servestack.wheels import normalize

SHA1 = r"^[0-9a-f]{40}$"
# The names from platforms.py's one table; pydantic reads the Literal at run time, mypy cannot.
PLATFORMS = tuple(platforms.PLATFORMS)


class Evidence(UserModel):
    """A fact a PR's merge introduced, checked in the package's files (see probe/static/evidence.py's
    `evidence_problem`, which both `lock` and the static probe use). Exactly one kind:

    - `file` with `contains` (a string) or `pattern` (a regular expression) in that file;
    - `attribute`: `package.module:name` (or `:Class.name`), defined in that module's source;
    - `flag`: an engine flag (`--gdn-prefill-backend`), declared in the package's sources;
    - `env`: a `VLLM_*` variable, registered in the package's sources.
    """

    file: str | None = None
    contains: str | None = None
    pattern: str | None = None
    attribute: Annotated[str | None, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")] = None
    flag: Annotated[str | None, Field(pattern=r"^--[a-z0-9][a-z0-9-]*$")] = None
    env: Annotated[str | None, Field(pattern=r"^[A-Z_][A-Z0-9_]*$")] = None

    @model_validator(mode="after")
    def _one_kind(self) -> Evidence:
        exactly_one(self, {"file": "with `contains` or `pattern`", "attribute": "", "flag": "", "env": ""})
        if self.file is not None:
            exactly_one(self, {"contains": "a string", "pattern": "a regular expression"}, lead="`file` needs")
        if self.file is None and (self.contains is not None or self.pattern is not None):
            raise ValueError("`contains` and `pattern` go with `file`")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"`pattern` is not a regular expression: {exc}") from None
        return self

    def to_json(self) -> dict[str, str]:
        return self.model_dump(exclude_none=True)


# The checks a PR can be shown necessary by: smoke's disaggregated shape (serving and its oracle), the
# oracle under load with async scheduling (a GPU), and the static probe's GDN prefill kernel choice on a
# simulated SM100. smoke/ablation.py runs each; a test holds its table to this list.
PRCheck = Literal["disaggregated-smoke", "loaded-oracle", "gdn-prefill-kernel"]
PR_CHECKS: tuple[str, ...] = get_args(PRCheck)


class PullRequest(UserModel):
    """An upstream PR the package must contain, as shipped or as an overlay."""

    repo: Annotated[str, Field(pattern=r"^[\w.-]+/[\w.-]+$")]
    number: Annotated[int, Field(gt=0)]
    merge_commit: Annotated[str | None, Field(pattern=SHA1)] = None
    title: str | None = None
    merged: str | None = None  # the day it was merged (YYYY-MM-DD), for the reader
    evidence: list[Evidence] = []
    # The check that fails without this PR (smoke/ablation.py runs it on the image and on the stack's
    # variant without the PR): its name, and why it is the one that tells them apart.
    check: PRCheck | None = None

    @property
    def label(self) -> str:
        return f"{self.repo}#{self.number}"


class LocalPatch(UserModel):
    """A Python-only change of our own onto the pinned wheel (a diff in `pins/patches/`, in the
    wheel's own paths), for what no upstream PR fixes yet; the reason is part of the record."""

    file: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*\.diff$")]
    reason: Annotated[str, Field(min_length=10)]


class GitSource(UserModel):
    url: str
    commit: Annotated[str, Field(pattern=SHA1)]


class Package(UserModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    version: str | None = None
    extras: list[str] = []
    git: GitSource | None = None
    index: str | None = None
    # Why the stack accepts an image without this package when its index cannot be had where the
    # lock is made (not configured, unreachable, or without the pinned version): the lock then
    # records it as unavailable, by name, with this reason. Without it such a package fails the lock.
    if_unavailable: Annotated[str | None, Field(min_length=10)] = None
    prs: list[PullRequest] = []
    patches: list[LocalPatch] = []

    @model_validator(mode="after")
    def _one_source(self) -> Package:
        exactly_one(self, {"version": "from a package index", "git": "url + commit"})
        if self.if_unavailable is not None and (self.index in (None, "pypi") or self.version is None):
            raise ValueError("`if_unavailable` is for a `version` pinned on a named index other than pypi (`index`)")
        return self

    @property
    def requirement(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        if self.git:
            return f"{self.name}{extras} @ git+{self.git.url}@{self.git.commit}"
        return f"{self.name}{extras}=={self.version}"


class Index(UserModel):
    """A package index, by name. Where it is, is configuration (servestack.sources.indexes.locate): the
    environment or uv's configuration, else `url`, a default location (a PEP 503 simple URL)."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    url: str | None = None


class Exclusion(UserModel):
    """A dependency left out of the image on purpose; the reason is part of the record."""

    name: str
    reason: Annotated[str, Field(min_length=10)]


class DebianBase(UserModel):
    """A base the project assembles itself from locked Debian packages (servestack.debian), for when no base image can be pulled."""

    suite: Literal["bookworm", "trixie"]
    packages: list[str]


class BaseImage(UserModel):
    image: str | None = None
    debian: DebianBase | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> BaseImage:
        exactly_one(self, {"image": "a registry reference", "debian": "a base built here"})
        return self


class ModelShapes(UserModel):
    """The shapes a checkpoint's config.json gives its kernels: what the static probe asks each GPU
    kernel vLLM would pick to accept, for a model the image does not carry (a path on the GPU host)."""

    head_dim: Annotated[int, Field(gt=0)]
    num_attention_heads: Annotated[int, Field(gt=0)]
    num_key_value_heads: Annotated[int, Field(gt=0)]
    linear_key_head_dim: Annotated[int, Field(gt=0)]
    linear_value_head_dim: Annotated[int, Field(gt=0)]
    linear_num_key_heads: Annotated[int, Field(gt=0)]
    linear_num_value_heads: Annotated[int, Field(gt=0)]
    source: Annotated[str, Field(min_length=10)]  # where the values were read


class SmokeModel(UserModel):
    """The model the smoke stage serves: made offline by the build (`make`), or a path on the GPU host.
    A GPU stack may give both: smoke serves the made model (on CPU or GPU, as its engine runs), and
    `path` with `config` stays the production checkpoint the static probe checks kernels against."""

    name: str
    make: dict[str, int | str] | None = None
    path: str | None = None
    config: ModelShapes | None = None  # a `path` model's shapes, recorded from its checkpoint
    # Seconds smoke gives each serving shape to serve, cold (unset: smoke.serving.DEFAULT_READY_TIMEOUT).
    ready_timeout_s: Annotated[float | None, Field(gt=0)] = None

    @model_validator(mode="after")
    def _an_origin(self) -> SmokeModel:
        if self.make is None and self.path is None:
            raise ValueError("give `make` (a tiny model built offline), `path` (a checkpoint on the GPU host), or both")
        return self


class GdnPrefill(UserModel):
    """Which GDN prefill backend vLLM's own resolver must choose on the target device."""

    device_capability: Annotated[str, Field(pattern=r"^\d+\.\d+$")]
    head_k_dim: Annotated[int, Field(gt=0)]
    backend: Literal["flashinfer", "triton", "cutedsl"]


class FastPath(UserModel):
    """What the image must have for the stack's fast path; the static probe proves each inside the image."""

    torch_cuda_major: Annotated[int | None, Field(gt=0)] = None  # minimum major of torch.version.cuda
    packages: list[str] = []  # distributions that must be installed (e.g. the cu13 CUTLASS DSL libraries)
    # module -> the distribution whose files importing it must load (`nixl: nixl-cu13`): packages that
    # pick a CUDA build at import time are seen to pick this one, so nothing the stack runs needs a
    # CUDA 12 twin the stack excludes.
    loads: dict[Annotated[str, Field(pattern=r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")], str] = {}
    gdn_prefill: GdnPrefill | None = None


class Link(UserModel):
    """A symlink the image's top layer adds: its path (the key) points at the one installed file `target` matches."""

    target: Annotated[str, Field(pattern=r"^[^/].*$")]  # a glob under site-packages, matching exactly one file
    reason: Annotated[str, Field(min_length=10)]


class Prebuilt(UserModel):
    """FlashInfer modules compiled into the image at build time (image/prebuilt.py), so that no engine
    compiles them at start: each platform's target GPUs, as FLASHINFER_CUDA_ARCH_LIST words."""

    modules: Annotated[list[Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]], Field(min_length=1)]
    archs: dict[Literal[PLATFORMS],  # type: ignore[valid-type]
                Annotated[list[Annotated[str, Field(pattern=r"^\d+\.\d+[af]?$")]], Field(min_length=1)]]


class GpuNode(UserModel):
    """What a GPU node's runtime needs from the image; the static probe's gpu-node section proves each."""

    # What enroot's nvidia hook must ask nvidia-container-cli for, given the image's environment.
    capabilities: Annotated[list[Literal["compute", "utility", "video", "graphics", "display", "compat32"]],
                            Field(min_length=1)]
    require_cuda: Annotated[str | None, Field(pattern=r"^\d+\.\d+$")] = None  # the hook's --require=cuda>=X.Y
    min_driver: Annotated[int | None, Field(gt=0)] = None  # the node preflight's NVIDIA driver minimum (major)
    verbs_providers: list[Annotated[str, Field(pattern=r"^[a-z0-9_]+$")]] = []  # every libibverbs copy finds these
    cuda_arch: Annotated[str | None, Field(pattern=r"^sm_\d+a?$")] = None  # the in-image nvcc builds a cubin for it
    # FlashInfer JIT modules the recipes reach ("module:generator"): the probe says which are prebuilt.
    kernels: list[Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]] = []
    prebuilt: Prebuilt | None = None


class Stack(UserModel):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    platforms: Annotated[list[Literal[PLATFORMS]], Field(min_length=1)]  # type: ignore[valid-type]
    python: Annotated[str, Field(pattern=r"^3\.\d+$")]
    # Dependencies resolve as of this moment (uv's --exclude-newer): a relock months later gives
    # the same files. `lock --upgrade` moves it.
    resolved_at: Annotated[str | None, Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")] = None
    base: BaseImage
    indexes: list[Index] = []
    # Git mirrors of upstream repositories ("owner/name": path or URL), for PR history without GitHub.
    mirrors: dict[str, str] = {}
    fast_path: FastPath | None = None
    packages: Annotated[list[Package], Field(min_length=1)]
    exclude: list[Exclusion] = []
    environment: dict[str, str] = {}
    links: dict[Annotated[str, Field(pattern=r"^/[^*?\[\]]+$")], Link] = {}
    gpu_node: GpuNode | None = None
    smoke_model: SmokeModel

    @field_validator("environment")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
                raise ValueError(f"{key!r} is not an environment variable name (expected A-Z, 0-9, _)")
        return value

    @model_validator(mode="after")
    def _indexes_exist(self) -> Stack:
        known = {i.name for i in self.indexes} | {"pypi"}
        for package in self.packages:
            if package.index is not None and package.index not in known:
                raise ValueError(
                    f"package {package.name!r} names index {package.index!r}, "
                    f"but `indexes` defines {sorted(known) or 'none'}"
                )
        return self

    @model_validator(mode="after")
    def _prebuilt_for_every_platform(self) -> Stack:
        prebuilt = self.gpu_node.prebuilt if self.gpu_node else None
        missing = [p for p in self.platforms if prebuilt and p not in prebuilt.archs]
        if missing:
            raise ValueError(f"gpu_node.prebuilt.archs names no target GPUs for {', '.join(missing)}; "
                             f"expected an entry for each of the stack's platforms ({', '.join(self.platforms)})")
        return self

    def package(self, name: str) -> Package | None:
        return next((p for p in self.packages if normalize(p.name) == normalize(name)), None)


def load_stack(file: Path) -> Stack:
    """Read and validate a stack file; every problem is reported with file, line, column and field."""
    return yamlfile.load_model(file, Stack, "a mapping of stack fields")
