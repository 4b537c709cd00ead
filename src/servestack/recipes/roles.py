"""One recipe's roles (prefill, decode, aggregated) as the engine sees them, in both srt-slurm layouts,
with the position of every setting, so a check comparing two roles can name both lines.

A setting is named the way the engine's rules name it (kvrules.py): `flag:NAME`, `env:NAME`,
`json:FLAG.KEY` (a key of a flag's JSON value), `recipe:container`, `recipe:model.path`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from servestack.recipes import schema as S
from servestack.recipes.structure import is_int
from servestack.util.yamlfile import Node

V1_MODES = {"prefill": "prefill", "decode": "decode", "agg": "aggregated"}


@dataclass(frozen=True, kw_only=True)
class Found:
    """A setting's value in one role (None: the role leaves it to the engine) and where the recipe says it."""

    value: Any
    node: Node | None  # the value's node; else the role's own mapping (where the setting would go)
    path: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Role:
    name: str  # prefill | decode | agg
    engine: str  # vllm, sglang, ...
    node: Node | None  # the role's engine-argument mapping (where a missing flag would be written)
    path: tuple[str, ...]
    args: dict[str, Node] = field(default_factory=dict)
    env: dict[str, tuple[Node, tuple[str, ...]]] = field(default_factory=dict)  # as the worker sees it (v1: shared wins)
    container: tuple[Node, tuple[str, ...]] | None = None
    model: tuple[Node, tuple[str, ...]] | None = None
    workers: int | None = None
    env_at: tuple[Node | None, tuple[str, ...]] | None = None  # where a variable the role lacks would be written

    def flag(self, name: str) -> Found:
        """A flag as srt-slurm passes it: `a_b` and `a-b` are one flag; `no-X: true` sets switch X false."""
        for key, node in self.args.items():
            spelled = key.replace("_", "-")
            if spelled == name:
                return Found(value=node.value, node=node, path=self.path + (key,))
            if spelled == f"no-{name}" and node.value is True:
                return Found(value=False, node=node, path=self.path + (key,))
        return Found(value=None, node=self.node, path=self.path)

    def int_flag(self, name: str, default: int | None = None) -> int | None:
        value = self.flag(name).value
        return value if is_int(value) else default

    def setting(self, name: str) -> Found:
        kind, _, what = name.partition(":")
        if kind == "flag":
            return self.flag(what)
        if kind == "env":
            missing = self.env_at or (self.node, self.path)
            node, path = self.env.get(what, (None, missing[1]))
            return Found(value=None if node is None else str(node.value), node=node or missing[0] or self.node, path=path)
        if kind == "json":
            flag, _, key = what.partition(".")
            found = self.flag(flag)
            try:
                data = json.loads(found.value) if isinstance(found.value, str) else None
            except ValueError:
                data = None
            return Found(value=data.get(key) if isinstance(data, dict) else None, node=found.node, path=found.path)
        at = {"container": self.container, "model.path": self.model}.get(what)
        return Found(value=None if at is None else at[0].value, node=at[0] if at else self.node,
                     path=at[1] if at else self.path)


def _map(node: Node | None) -> dict[str, Node]:
    return dict(node.value) if node is not None and node.is_map else {}


def _int(node: Node | None) -> int | None:
    return node.value if node is not None and is_int(node.value) else None


def roles(root: Node) -> dict[str, Role]:
    """The roles a complete recipe starts, by name (prefill/decode or agg)."""
    shared_env: dict[str, tuple[Node, tuple[str, ...]]] = {
        k: (n, ("environment", k)) for k, n in _map(root.get("environment")).items()}
    model = root.get("model")
    container = model.get("container") if model is not None and model.is_map else None
    path_node = model.get("path") if model is not None and model.is_map else None
    common = {"container": (container, ("model", "container")) if container is not None else None,
              "model": (path_node, ("model", "path")) if path_node is not None else None}
    out: dict[str, Role] = {}
    schema = root.get("schema")
    if schema is not None and schema.value == 2:
        top = root.get("engine")
        top_type = top.value if top is not None and isinstance(top.value, str) else None
        for name, role in _map(root.get("roles")).items():
            if not role.is_map:
                continue
            env = dict(shared_env)
            env.update({k: (n, ("roles", name, "env", k)) for k, n in _map(role.get("env")).items()})
            own = role.get("container")
            eng = role.get("engine")
            etype = eng.value if eng is not None and isinstance(eng.value, str) else top_type
            out[name] = Role(name=name, engine=str(etype or ""), node=role.get("args") or role,
                             path=("roles", name, "args"), args=_map(role.get("args")), env=env,
                             env_at=(role.get("env") or role, ("roles", name, "env")),
                             container=(own, ("roles", name, "container")) if own is not None else common["container"],
                             model=common["model"], workers=_int(role.get("workers")))
        return out
    backend = root.get("backend")
    type_node = backend.get("type") if backend is not None and backend.is_map else None
    btype = type_node.value if type_node is not None else "sglang"
    cfg_key = S.ENGINE_CONFIG_KEY.get(btype) if isinstance(btype, str) else None
    cfg = backend.get(cfg_key) if cfg_key and backend is not None and backend.is_map else None
    res = root.get("resources")
    shape = S.deployment_shape(res.plain() if res is not None else None)
    names = ("prefill", "decode") if shape == "disaggregated" else ("agg",)
    for name in names:
        mode = V1_MODES[name]
        env_key = f"{mode}_environment"
        env = {k: (n, ("backend", env_key, k)) for k, n in _map(backend.get(env_key)).items()} \
            if backend is not None and backend.is_map else {}
        env.update(shared_env)  # srt-slurm applies the top-level environment after the role's (worker_stage.py)
        args = cfg.get(mode) if cfg is not None and cfg.is_map else None
        workers = _int(res.get(f"{name}_workers")) if res is not None and res.is_map else None
        env_node = backend.get(env_key) if backend is not None and backend.is_map else None
        out[name] = Role(name=name, engine=str(btype), node=args or cfg or backend, path=("backend", str(cfg_key), mode),
                         args=_map(args), env=env, workers=workers, env_at=(env_node or backend, ("backend", env_key)),
                         **common)
    return out
