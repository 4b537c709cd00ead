"""Which settings prefill and decode must share to exchange KV over NIXL, read from the engine's own source.

The rules are derived by parsing (ast, nothing imported) the vLLM of the lock, so relocking a newer
vLLM re-derives them:

  * `hash`: every factor of `compute_nixl_compatibility_hash` (a handshake with a different hash
    fails at the first request), including the factors of helpers it calls;
  * `handshake`: every remote field the `_validate_remote*` functions read. One compared with `!=`
    against the local value on the way to a raise must be equal (under the conjuncts beside the
    comparison, kept as `condition`); any other is heterogeneity the engine accepts;
  * `state`: what the state transfer needs beyond both: an environment value an assertion of the
    NIXL worker demands ("Set VLLM_X=V"), and remote fields the worker reads but never validates
    (the SSM state sizes, which follow the SSM cache dtype).

A factor becomes recipe settings through vLLM's own `EngineArgs.create_engine_config` (which
engine argument fills which config attribute); only what that cannot say (function parameters,
fields of the handshake metadata) goes through the small tables below.

Run `python -m servestack.recipes.kvrules WHEEL ENGINE_JSON` to write them into an engine
description from a wheel file, offline; `describe()` adds them from the installed vLLM.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.errors import InputError

KV_DIR = "vllm/distributed/kv_transfer/"
ARG_UTILS = "vllm/engine/arg_utils.py"
HASH_FUNCTION = "compute_nixl_compatibility_hash"
KINDS = ("hash", "handshake", "state")
POLICIES = ("equal", "heterogeneous", "value")

# Hash parameters the caller fills: the worker's attention backend, the connector class's mode.
PARAMETER_SETTINGS = {"attn_backend_name": ("flag:attention-backend",),
                      "transfer_mode": ("json:kv-transfer-config.kv_connector",)}
# Handshake metadata fields, by what sets them on each side.
FIELD_SETTINGS = {"tp_size": ("flag:tensor-parallel-size",), "dcp_size": ("flag:decode-context-parallel-size",),
                  "pcp_size": ("flag:prefill-context-parallel-size",), "block_size": ("flag:block-size",),
                  "kv_cache_layout": ("env:VLLM_KV_CACHE_LAYOUT",), "attn_backend_name": ("flag:attention-backend",),
                  "ssm_sizes": ("flag:mamba-ssm-cache-dtype",),
                  "physical_per_logical": ("flag:block-size",)}
# A module constant or import in a hash (vLLM's version, the connector's protocol version) is the build.
BUILD_SETTINGS = ("recipe:container",)
# What a model_config method answers comes from the model's own config.
MODEL_SETTINGS = ("recipe:model.path", "flag:hf-overrides")
_SET_ENV = re.compile(r"Set (VLLM_[A-Z0-9_]+)=(\w+)")


@dataclass(frozen=True, kw_only=True)
class KvRule:
    """One setting the roles exchanging KV must agree on (or may differ in), and the engine's reason."""

    name: str  # the engine's own name: a hash factor, a handshake field, an environment variable
    kind: str  # hash | handshake | state
    policy: str  # equal | heterogeneous (accepted) | value (both roles must set `value`)
    settings: tuple[str, ...]  # flag:NAME, env:NAME, json:FLAG.KEY, recipe:PATH ("container", "model.path")
    source: str  # file:function of the engine that enforces it
    reason: str  # the engine's expression or message
    condition: str = ""  # when the engine enforces it (the other conjuncts of its test)
    value: str = ""

    def as_json(self) -> dict[str, Any]:
        out = {"name": self.name, "kind": self.kind, "policy": self.policy, "settings": list(self.settings),
               "source": self.source, "reason": self.reason}
        out.update({k: v for k, v in (("condition", self.condition), ("value", self.value)) if v})
        return out


# -- reading sources ---------------------------------------------------------------------------------
Sources = dict[str, str]  # path inside the wheel -> text


def wheel_sources(wheel: Path) -> Sources:
    with zipfile.ZipFile(wheel) as z:
        return {n: z.read(n).decode() for n in z.namelist()
                if n.endswith(".py") and (n.startswith(KV_DIR) or n == ARG_UTILS)}


def installed_sources() -> Sources:
    import vllm

    root = Path(vllm.__file__).parent.parent
    files = [*sorted((root / KV_DIR).rglob("*.py")), root / ARG_UTILS]
    return {str(f.relative_to(root)): f.read_text() for f in files if f.exists()}


def _functions(sources: Sources, select: Callable[[str], bool]) -> Iterator[tuple[str, ast.Module, ast.FunctionDef]]:
    for path in sorted(sources):
        if not path.startswith(KV_DIR) or "nixl" not in path:
            continue
        tree = ast.parse(sources[path])
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and select(node.name):
                yield path, tree, node


def engine_arguments(sources: Sources) -> dict[tuple[str, str], str]:
    """(config class, attribute) -> the engine argument (flag) filling it, from create_engine_config's calls."""
    tree = ast.parse(sources.get(ARG_UTILS, ""))
    found: dict[tuple[str, str], str] = {}
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        local = {t.id: a.value for a in ast.walk(fn) if isinstance(a, ast.Assign) for t in a.targets if isinstance(t, ast.Name)}
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            if not isinstance(call.func, ast.Name) or not call.func.id.endswith("Config"):
                continue
            for kw in call.keywords:
                value = local.get(kw.value.id, kw.value) if isinstance(kw.value, ast.Name) else kw.value
                if _builds_config(value):
                    continue  # a nested config object, not a value an engine argument fills
                called = {id(c.func) for c in ast.walk(value) if isinstance(c, ast.Call)}
                fields = [a.attr for a in ast.walk(value) if isinstance(a, ast.Attribute) and id(a) not in called
                          and isinstance(a.value, ast.Name) and a.value.id == "self"]
                if kw.arg and fields:
                    found.setdefault((call.func.id, kw.arg), fields[0])
    return found


def _builds_config(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Name) and node.func.id.endswith("Config"))
        or (isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_config")))


def engine_fields(sources: Sources) -> frozenset[str]:
    """The fields of vLLM's EngineArgs: each is a flag (`kv_cache_dtype` is `--kv-cache-dtype`)."""
    tree = ast.parse(sources.get(ARG_UTILS, ""))
    return frozenset(n.target.id for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == "EngineArgs"
                     for n in c.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_"))


# -- the hash -----------------------------------------------------------------------------------------
class _Factors:
    def __init__(self, module: ast.Module, args: dict[tuple[str, str], str], fields: frozenset[str]):
        self.module, self.args, self.fields = module, args, fields
        self.helpers = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}

    def settings(self, expr: ast.AST, fn: ast.FunctionDef, depth: int = 0) -> tuple[str, ...]:
        local = {t.id: a.value for a in ast.walk(fn) if isinstance(a, ast.Assign) for t in a.targets if isinstance(t, ast.Name)}
        params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        owners = {id(a.value) for a in ast.walk(expr) if isinstance(a, ast.Attribute)}  # `cache_config` of cache_config.x
        out: list[str] = []
        for node in ast.walk(expr):
            if id(node) in owners:
                continue
            if isinstance(node, ast.Name) and node.id in PARAMETER_SETTINGS and node.id in params:
                out += PARAMETER_SETTINGS[node.id]
            elif isinstance(node, ast.Name) and node.id in local and depth < 3:
                out += self.settings(local[node.id], fn, depth + 1) if node is not local[node.id] else ()
            elif isinstance(node, ast.Name) and node.id not in params and node.id not in local and node.id not in self.helpers \
                    and node.id not in dir(builtins) and isinstance(getattr(node, "ctx", None), ast.Load):
                out += BUILD_SETTINGS
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.helpers and depth < 3:
                helper = self.helpers[node.func.id]
                out += [f"flag:{a.attr.replace('_', '-')}" for a in ast.walk(helper) if isinstance(a, ast.Attribute)
                        and isinstance(a.value, ast.Name) and a.value.id == "vllm_config" and a.attr in self.fields]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.startswith("get_"):
                out += MODEL_SETTINGS
            elif isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
                owner = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
                arg = self.args.get((_camel(owner), node.attr))
                if arg is not None:
                    out.append("recipe:model.path" if arg == "model" else f"flag:{arg.replace('_', '-')}")
        return tuple(dict.fromkeys(out))


def hash_rules(sources: Sources) -> list[KvRule]:
    args = engine_arguments(sources)
    rules: list[KvRule] = []
    for path, module, fn in _functions(sources, lambda n: n == HASH_FUNCTION):
        factors = _Factors(module, args, engine_fields(sources))
        for node in ast.walk(fn):
            keys = [k for k in node.keys if isinstance(k, ast.Constant)] if isinstance(node, ast.Dict) else []
            if isinstance(node, ast.Dict) and len(keys) == len(node.keys) and len(keys) > 2:
                for key, value in zip(keys, node.values, strict=True):
                    rules.append(KvRule(name=str(key.value), kind="hash", policy="equal",
                                        settings=factors.settings(value, fn), source=f"{path}:{fn.name}",
                                        reason=f"compatibility hash factor {key.value!r} = {ast.unparse(value)}"))
                break
    return rules


# -- the handshake -----------------------------------------------------------------------------------
def _remote_field(node: ast.AST, remote_params: set[str]) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in remote_params:
        return node.attr
    if isinstance(node, ast.Name) and node.id.startswith("remote_"):
        return node.id.removeprefix("remote_")
    return None


def _raises(body: list[ast.stmt]) -> str | None:
    """The message of the first raise or assert in `body` (searched deeply), None without one."""
    nodes = [n for stmt in body for n in ast.walk(stmt)]
    for node in nodes:  # a raise says what is refused; an assert inside an escape hatch says less
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            return _text(node.exc.args[0])
    for node in nodes:
        if isinstance(node, ast.Assert):
            return _text(node.msg) if node.msg is not None else ast.unparse(node.test)
    return None


def _text(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{...}" for v in node.values)
    return ast.unparse(node)


def handshake_rules(sources: Sources) -> list[KvRule]:
    found: dict[str, KvRule] = {}
    validators = list(_functions(sources, lambda n: n.startswith("_validate_remote")))
    for path, _, fn in validators:
        remote = {a.arg for a in fn.args.args if a.arg != "self" and not a.arg.startswith("remote_")}
        source = f"{path}:{fn.name}"
        for node in ast.walk(fn):
            test, body = (node.test, node.body) if isinstance(node, ast.If) else (None, [])
            if test is None:
                continue
            parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
            for part in parts:
                if not (isinstance(part, ast.Compare) and len(part.ops) == 1 and isinstance(part.ops[0], ast.NotEq)):
                    continue
                sides = [_remote_field(s, remote) for s in (part.left, part.comparators[0])]
                field = next((s for s in sides if s), None)
                message = _raises(body)
                if field is None or all(sides) or message is None:
                    continue
                condition = " and ".join(ast.unparse(p) for p in parts if p is not part)
                found.setdefault(field, KvRule(name=field, kind="handshake", policy="equal",
                                               settings=FIELD_SETTINGS.get(field, ()), source=source,
                                               reason=message, condition=condition))
    for path, _, fn in validators:  # only now: a field any validator requires equal is not heterogeneous
        remote = {a.arg for a in fn.args.args if a.arg != "self" and not a.arg.startswith("remote_")}
        source = f"{path}:{fn.name}"
        for node in ast.walk(fn):
            field = _remote_field(node, remote)
            if field and field not in found and field in FIELD_SETTINGS:
                found[field] = KvRule(name=field, kind="handshake", policy="heterogeneous",
                                      settings=FIELD_SETTINGS[field], source=source,
                                      reason=f"validated at run time by {fn.name}, which accepts differing values")
    return sorted(found.values(), key=lambda r: r.name)


# -- the state transfer --------------------------------------------------------------------------------
def state_rules(sources: Sources, validated: set[str]) -> list[KvRule]:
    rules: dict[str, KvRule] = {}
    for path, _, fn in _functions(sources, lambda n: True):
        source = f"{path}:{fn.name}"
        for node in ast.walk(fn):
            if isinstance(node, ast.Assert) and node.msg is not None:
                m = _SET_ENV.search(_text(node.msg))
                if m and m.group(1) not in rules:
                    rules[m.group(1)] = KvRule(name=m.group(1), kind="state", policy="value", value=m.group(2),
                                               settings=(f"env:{m.group(1)}",), source=source, reason=_text(node.msg))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "nixl_agent_meta":
                field = node.attr
                if field in FIELD_SETTINGS and field not in validated and field not in rules:
                    rules[field] = KvRule(name=field, kind="state", policy="equal", settings=FIELD_SETTINGS[field],
                                          source=source, reason=f"the remote {field} is read by {fn.name} but never "
                                                                "validated: differing values move state silently wrong")
    return list(rules.values())


def derive(sources: Sources) -> list[KvRule]:
    hashed = hash_rules(sources)
    if not hashed:
        raise InputError(KV_DIR, HASH_FUNCTION, "not found in the engine's NIXL connector: the rules cannot be derived")
    handshake = handshake_rules(sources)
    validated = {r.name for r in hashed + handshake}
    return hashed + handshake + state_rules(sources, validated)


def describe_rules(sources: Sources, origin: str) -> dict[str, Any]:
    return {"source": origin, "rules": [r.as_json() for r in derive(sources)]}


# -- read back ----------------------------------------------------------------------------------------
def load_rules(data: Any, path: Path | str) -> tuple[KvRule, ...]:
    """The rules of an engine description's `kv_transfer` section (none when it has none)."""
    if data is None:
        return ()
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise InputError(path, "kv_transfer", "expected {\"source\": ..., \"rules\": [...]}")
    out = []
    for i, r in enumerate(data["rules"]):
        if not isinstance(r, dict) or r.get("kind") not in KINDS or r.get("policy") not in POLICIES:
            raise InputError(path, f"kv_transfer.rules[{i}]", f"expected a rule with kind in {KINDS} and policy in {POLICIES}")
        out.append(KvRule(name=str(r["name"]), kind=r["kind"], policy=r["policy"], settings=tuple(r.get("settings", ())),
                          source=str(r.get("source", "")), reason=str(r.get("reason", "")),
                          condition=str(r.get("condition", "")), value=str(r.get("value", ""))))
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    import json

    from servestack.util.fsutil import atomic_write_text, canonical_json

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.stderr.write("usage: python -m servestack.recipes.kvrules VLLM_WHEEL ENGINE_JSON\n")
        return 2
    wheel, target = Path(argv[0]), Path(argv[1])
    description = json.loads(target.read_text())
    from servestack.util.fsutil import sha256_file

    description["kv_transfer"] = describe_rules(wheel_sources(wheel), f"{wheel.name} sha256:{sha256_file(wheel)}")
    atomic_write_text(target, canonical_json(description))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
