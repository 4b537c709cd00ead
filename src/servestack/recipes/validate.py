"""Validate srt-slurm recipes (v1 layout and the 2.0 `schema: 2` layout) before they reach a cluster.

Checks, each reported as an InputError naming file:line:column and the key path:
  * keys: unknown or misspelled keys (with the closest known key suggested), required keys;
  * types: ints, bools, strings, mappings, lists where srt-slurm expects them;
  * arithmetic: workers x GPUs per worker fit nodes x GPUs per node; a worker spanning nodes uses
    whole nodes; the engine's tensor x pipeline x data parallel sizes equal the GPUs per worker;
    expert-parallel sizes divide them;
  * benchmark concurrencies: srt-slurm's "64x128x256" string or a list; positive integers,
    ascending, no duplicates;
  * engine flags: every vLLM flag and VLLM_* environment variable exists in the engine version the
    stack locks (pins/<stack>.engine.json), with the closest spelling suggested;
  * image binding: recipes rendered by servestack carry either the unbound placeholder or a
    `repo@sha256:<64 hex>` reference (never a tag), and a bound one names the same image in
    identity.container.image and records the stack's lock sha256 in its header.

Recipes in srt-slurm's override form (`base:` + `override_*` / `zip_override_*`) and sweep form
(`sweep:` with `{placeholder}` values) are understood: placeholders are not type-checked.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..errors import InputError, Location
from ..imageref import ImageRef
from . import schema as S
from .engine import DYNAMO_VLLM, VLLM_SERVE, EngineSpec, ParserSpec, load_engine
from ..yamlfile import Node, parse

UNBOUND_IMAGE = "servestack-unbound"
RENDER_MARK = "# Rendered by servestack"
_STACK_COMMENT = re.compile(r"^# stack: ([A-Za-z0-9_.-]+)\s*$", re.M)
_CONC_STRING = re.compile(r"^[0-9]+(x[0-9]+)*$")
_PLACEHOLDER = re.compile(r"\{\s*[A-Za-z_][\w.-]*\s*\}")


image_ref_problem = ImageRef.problem


def concurrency_list(value: Any) -> list[int]:
    """srt-slurm's benchmark.concurrencies ("64x128x256", a list, or one integer) as integers.

    The one reading of the field: the validator and the stages both use it. Raises ValueError
    naming what is wrong: not positive integers, empty, a duplicate, neither ascending nor descending.
    """
    if _is_int(value):
        values = [value]
    elif isinstance(value, str):
        if not _CONC_STRING.match(value):
            raise ValueError(f"malformed concurrency list {value!r}: expected positive integers joined by 'x', e.g. \"64x128x256\"")
        values = [int(p) for p in value.split("x")]
    elif isinstance(value, list):
        values = []
        for v in value:
            if isinstance(v, str) and v.isdigit():
                values.append(int(v))  # srt-slurm's loader coerces numeric strings
            elif _is_int(v):
                values.append(v)
            else:
                raise ValueError(f"malformed concurrency list: {v!r} is not an integer")
    else:
        raise ValueError(f"malformed concurrency list {value!r}: expected \"64x128x256\" or a list of integers")
    if not values:
        raise ValueError("malformed concurrency list: empty")
    bad = [x for x in values if x <= 0]
    if bad:
        raise ValueError(f"malformed concurrency list: {bad[0]} is not a positive integer")
    dups = sorted({x for x in values if values.count(x) > 1})
    if dups:
        raise ValueError(f"malformed concurrency list: {dups[0]} appears more than once")
    if values != sorted(values) and values != sorted(values, reverse=True):
        raise ValueError(f"malformed concurrency list: {values} is neither ascending nor descending")
    return values


def header_stack(text: str) -> str | None:
    """The stack a rendered recipe names in its header comment (`# stack: S`), if any."""
    m = _STACK_COMMENT.search("".join(line + "\n" for line in text.splitlines() if line.startswith("#")))
    return m.group(1) if m else None


def _suggest(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Checker:
    def __init__(self, file: str, engine: EngineSpec | None, sweep: bool):
        self.file = file
        self.engine = engine
        self.sweep = sweep
        self.errors: list[InputError] = []
        self.variant = ""  # an override variant being checked, named in its errors
        self.notes: list[str] = []  # what was not checked, and why (never skipped silently)

    def unchecked(self, engine_type: Any) -> None:
        if self.engine is not None and engine_type != self.engine.engine:
            note = (f"{self.file}: {engine_type} flags and environment not checked "
                    f"(the engine description describes {self.engine.engine}, not {engine_type})")
            if note not in self.notes:
                self.notes.append(note)

    # -- reporting ------------------------------------------------------------------------
    def err(self, node: Node | None, path: tuple[str, ...], problem: str, *, at_key: bool = False) -> None:
        if node is None:
            loc = Location(self.file)
        elif at_key and node.key_line is not None:
            loc = Location(self.file, node.key_line, node.key_column)
        else:
            loc = Location(self.file, node.line, node.column)
        field = ".".join(path)
        if self.variant:
            field = f"{self.variant}: {field}"
        self.errors.append(InputError(loc, field, problem))

    def placeholder(self, node: Node) -> bool:
        if not self.sweep:
            return False
        v = node.value
        if isinstance(v, str):
            return bool(_PLACEHOLDER.search(v))
        if isinstance(v, dict):  # `[{ conc }]` parses as a flow mapping {conc: null}
            return bool(v) and all(c.value is None for c in v.values())
        if isinstance(v, list):
            return any(self.placeholder(c) for c in v)
        return False

    # -- structure --------------------------------------------------------------------------
    def walk(self, node: Node, spec: Any, path: tuple[str, ...], *, keys_only: bool = False) -> None:
        if node.value is None:
            return  # every srt-slurm field is optional or nullable at this level; required keys are checked apart
        if self.placeholder(node):
            return
        if isinstance(spec, dict):
            if not node.is_map:
                if not keys_only:
                    self.err(node, path, f"expected a mapping, got {type(node.value).__name__}")
                return
            for key, child in node.value.items():
                if key not in spec:
                    self.err(child, path + (key,), "unknown key" + _suggest(key, spec), at_key=True)
                    continue
                self.walk(child, spec[key], path + (key,), keys_only=keys_only)
            return
        if keys_only:
            if spec == "backend" and node.is_map:
                self.backend(node, path, keys_only=True)
            if spec == "roles" and node.is_map:
                self.roles(node, path, keys_only=True)
            return
        self.leaf(node, spec, path)

    def leaf(self, node: Node, spec: str, path: tuple[str, ...]) -> None:
        v = node.value
        ok = True
        if spec == "str":
            ok = isinstance(v, str)
        elif spec == "int":
            ok = _is_int(v)
        elif spec == "bool":
            ok = isinstance(v, bool)
        elif spec == "num":
            ok = (_is_int(v) or isinstance(v, float))
        elif spec == "str|int":
            ok = isinstance(v, str) or _is_int(v)
        elif spec == "scalar":
            ok = not isinstance(v, (dict, list))
        elif spec == "map":
            ok = isinstance(v, dict)
        elif spec in ("bool|map",):
            ok = isinstance(v, (bool, dict))
        elif spec == "str|map":
            ok = isinstance(v, (str, dict))
        elif spec == "list":
            ok = isinstance(v, list)
        elif spec == "strlist":
            ok = isinstance(v, list) and all(isinstance(c.value, str) or self.placeholder(c) for c in v)
        elif spec == "strmap":
            ok = isinstance(v, dict)
            if ok:
                for k, c in v.items():
                    if isinstance(c.value, (dict, list)) and not self.placeholder(c):
                        self.err(c, path + (k,), "expected a scalar value")
        elif spec == "nodes":
            ok = _is_int(v) or v == "colocate"
        elif spec == "concurrencies":
            self.concurrencies(node, path)
        elif spec == "backend":
            ok = isinstance(v, dict)
            if ok:
                self.backend(node, path)
        elif spec == "roles":
            ok = isinstance(v, dict)
            if ok:
                self.roles(node, path)
        elif spec == "any":
            pass
        else:  # pragma: no cover - a schema typo
            raise AssertionError(f"unknown leaf type {spec}")
        if not ok:
            want = {"str": "a string", "int": "an integer", "bool": "true or false", "num": "a number",
                    "map": "a mapping", "list": "a list", "strlist": "a list of strings",
                    "strmap": "a mapping", "nodes": "an integer or 'colocate'"}.get(spec, spec)
            self.err(node, path, f"expected {want}, got {v!r}")

    def required(self, root: Node, required: dict) -> None:
        for parent_path, keys in required.items():
            parent = root
            for p in parent_path:
                parent = parent.get(p) if parent is not None else None
            if parent is None or not parent.is_map:
                continue
            for key in keys:
                if key not in parent.value:
                    self.err(parent, parent_path + (key,), "required key is missing")

    def backend(self, node: Node, path: tuple[str, ...], *, keys_only: bool = False) -> None:
        if keys_only:  # an override may omit the type its base sets: accept any backend's keys
            union: dict = {}
            for spec in S.BACKENDS_V1.values():
                union.update(spec)
            self.walk(node, union, path, keys_only=True)
            return
        type_node = node.get("type")
        btype = type_node.value if type_node is not None else "sglang"
        if not isinstance(btype, str) or btype not in S.BACKENDS_V1:
            if isinstance(btype, str) and self.placeholder(type_node):
                return
            self.err(type_node or node, path + ("type",), f"unknown backend type {btype!r}" + _suggest(str(btype), S.BACKENDS_V1))
            return
        self.walk(node, S.BACKENDS_V1[btype], path, keys_only=keys_only)

    def roles(self, node: Node, path: tuple[str, ...], *, keys_only: bool = False) -> None:
        for name, role in node.value.items():
            if name not in S.ROLE_NAMES:
                self.err(role, path + (name,), "unknown role" + _suggest(name, S.ROLE_NAMES) + " (roles are prefill, decode, agg)", at_key=True)
                continue
            self.walk(role, S.ROLE_V2, path + (name,), keys_only=keys_only)

    # -- concurrencies ----------------------------------------------------------------------
    def concurrencies(self, node: Node, path: tuple[str, ...]) -> None:
        if node.is_list and any(self.placeholder(c) for c in node.value):
            return
        try:
            concurrency_list(node.plain())
        except ValueError as e:
            bad = next((c for c in node.value if not _is_int(c.value) and not str(c.value).isdigit()), node) if node.is_list else node
            self.err(bad, path, str(e))

    # -- arithmetic -------------------------------------------------------------------------
    def _int(self, node: Node | None) -> int | None:
        if node is None or not _is_int(node.value):
            return None
        return node.value

    def fit(self, role: str, nodes_n: Node | None, workers_n: Node | None, gpus_n: Node | None,
            gpn: int, paths: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], share_with: int | None = None) -> int | None:
        """Check one role's topology; returns the GPUs per worker (None when unknown)."""
        nodes, workers, per = self._int(nodes_n), self._int(workers_n), self._int(gpus_n)
        for n, v, p, lo in ((nodes_n, nodes, paths[0], 0), (workers_n, workers, paths[1], 1), (gpus_n, per, paths[2], 1)):
            if v is not None and v < lo:
                self.err(n, p, f"must be at least {lo}, got {v}")
                return None
        if per is None:
            if nodes and workers:
                per = (nodes * gpn) // workers
                if per == 0:
                    self.err(workers_n, paths[1], f"{workers} workers cannot share {nodes} node(s) x {gpn} GPUs")
                    return None
            elif nodes == 0 and share_with is not None:
                per = share_with
            else:
                per = gpn
        if per > gpn and per % gpn:
            self.err(gpus_n or workers_n or nodes_n, paths[2], f"a {role} worker of {per} GPUs spans nodes of {gpn} GPUs but not whole nodes")
        if nodes and workers:
            need, have = workers * per, nodes * gpn
            if need > have:
                self.err(workers_n, paths[1],
                         f"{workers} {role} worker(s) x {per} GPUs = {need} GPUs do not fit in {nodes} node(s) x {gpn} GPUs = {have} GPUs")
        return per

    def parallel(self, engine_type: str, args: Node | None, per: int | None, where: tuple[str, ...], anchor: Node | None) -> None:
        if per is None or args is None or not args.is_map:
            return
        a = args.value

        def size(*names: str) -> tuple[int, Node | None, str | None]:
            for name in names:
                for spelled in (name, name.replace("-", "_"), name.replace("_", "-")):
                    if spelled in a:
                        n = a[spelled]
                        return (n.value if _is_int(n.value) else -1), n, spelled
            return 1, None, None

        if engine_type == "vllm":
            tp, tpn, tpk = size("tensor-parallel-size", "tp")
            pp, ppn, _ = size("pipeline-parallel-size", "pp")
            dp, dpn, dpk = size("data-parallel-size", "dp")
            if -1 in (tp, pp, dp):
                return
            if "data-parallel-size-local" in a or "data-parallel-start-rank" in a or "headless" in a:
                return  # a DP rank group launched per node: the product spans several srt-slurm workers
            world = tp * pp * dp
            if world != per:
                culprit = dpn or tpn or ppn or anchor
                key = dpk or tpk or "tensor-parallel-size"
                self.err(culprit, where + (key,),
                         f"tensor {tp} x pipeline {pp} x data {dp} parallel = {world} GPUs, but each worker has {per} GPUs")
        elif engine_type == "sglang":
            tp, tpn, tpk = size("tensor-parallel-size", "tp-size", "tp")
            pp, ppn, _ = size("pipeline-parallel-size", "pp-size", "pp")
            dp, dpn, dpk = size("data-parallel-size", "dp-size", "dp")
            ep, epn, epk = size("expert-parallel-size", "ep-size", "ep")
            if -1 in (tp, pp, dp, ep):
                return
            dp_attention = any(bool(a[k].value) for k in ("enable-dp-attention", "enable_dp_attention") if k in a)
            world = tp * pp if dp_attention else tp * pp * dp  # without DP attention, dp-size replicates tp groups
            if world != per:
                shown = f"tensor {tp} x pipeline {pp}" + ("" if dp_attention else f" x data {dp}")
                self.err(tpn or ppn or anchor, where + (tpk or "tp-size",),
                         f"{shown} parallel = {world} GPUs, but each worker has {per} GPUs")
            if dp_attention and dpn is not None and tp % dp:
                self.err(dpn, where + (dpk,), f"data parallel size {dp} does not divide tensor parallel size {tp}")
            if epn is not None and tp % ep:
                self.err(epn, where + (epk,), f"expert parallel size {ep} does not divide tensor parallel size {tp}")
        elif engine_type == "trtllm":
            tp, tpn, tpk = size("tensor_parallel_size")
            pp, ppn, _ = size("pipeline_parallel_size")
            cp, cpn, _ = size("context_parallel_size")
            ep, epn, epk = size("moe_expert_parallel_size")
            if -1 in (tp, pp, cp, ep):
                return
            world = tp * pp * cp
            if world != per:
                self.err(tpn or ppn or anchor, where + (tpk or "tensor_parallel_size",),
                         f"tensor {tp} x pipeline {pp} x context {cp} parallel = {world} GPUs, but each worker has {per} GPUs")
            if epn is not None and ep > 0 and tp % ep:
                self.err(epn, where + (epk,), f"expert parallel size {ep} does not divide tensor parallel size {tp}")

    # -- engine flags ---------------------------------------------------------------------------
    def flags(self, args: Node | None, where: tuple[str, ...], parser_name: str) -> None:
        """Every key of an engine argument mapping is a flag of the command srt-slurm starts, with a value it takes."""
        if self.engine is None or args is None or not args.is_map:
            return
        parser = self.engine.parser(parser_name)
        if parser is None:
            self.err(args, where, f"{self.engine.source or 'the engine description'} does not describe {parser_name!r}, "
                                  f"the command srt-slurm starts here: regenerate it with servestack.recipes.engine "
                                  f"where that command is installed", at_key=True)
            return
        for key, child in args.value.items():
            spec = parser.lookup(key)
            if spec is None:
                self.err(child, where + (key,),
                         f"--{key} is not a flag of {parser.command} ({self._versions(parser)})"
                         + _suggest(key, parser.flag_names()).replace("'", "").replace("mean ", "mean --"),
                         at_key=True)
                continue
            if self.placeholder(child):
                continue
            problem = spec.problem(child.value, flag=True)
            if problem:
                self.err(child, where + (key,), f"{problem}; allowed: {spec.allowed()}")

    def _versions(self, parser: ParserSpec) -> str:
        own = f"{parser.name} {parser.version}, " if parser.version else ""
        return f"{own}{self.engine.engine} {self.engine.version}"

    def env(self, envs: Node | None, where: tuple[str, ...]) -> None:
        """VLLM_* names must exist; any variable the engine reads must have a value it accepts."""
        if self.engine is None or envs is None or not envs.is_map:
            return
        for name, child in envs.value.items():
            spec = self.engine.environment.get(name)
            if spec is None:
                if name.startswith("VLLM_"):
                    self.err(child, where + (name,),
                             f"{name} is not an environment variable of {self.engine.engine} {self.engine.version}"
                             + _suggest(name, self.engine.environment), at_key=True)
                continue
            if self.placeholder(child):
                continue
            problem = spec.problem(child.value, flag=False)
            if problem:
                self.err(child, where + (name,), f"{problem}; allowed: {spec.allowed()}")


def worker_command(frontend_type: Any) -> str:
    """Which command srt-slurm starts a vLLM worker with: vLLM's own server behind a vLLM frontend,
    Dynamo's worker (`python -m dynamo.vllm`) otherwise (srt-slurm's default frontend is Dynamo)."""
    return VLLM_SERVE if frontend_type == "vllm" else DYNAMO_VLLM


def _frontend_type(root: Node) -> Any:
    fe = root.get("frontend")
    t = fe.get("type") if fe is not None and fe.is_map else None
    return t.value if t is not None else "dynamo"


def _merge(base: Node, over: Node) -> Node:
    """srt-slurm's deep_merge on positioned nodes: mappings merge, a null removes, others replace."""
    if not (base.is_map and over.is_map):
        return over
    merged = dict(base.value)
    for k, v in over.value.items():
        if v.value is None:
            merged.pop(k, None)
        elif k in merged:
            merged[k] = _merge(merged[k], v)
        else:
            merged[k] = v
    return Node(merged, base.line, base.column, base.key_line, base.key_column, base.tag)


def _list_lengths(node: Node) -> list[int]:
    if node.is_list:
        return [len(node.value)]
    if node.is_map:
        return [n for child in node.value.values() for n in _list_lengths(child)]
    return []


def _zip_length(c: _Checker, node: Node, path: tuple[str, ...]) -> int | None:
    """srt-slurm's zip rule: lists of length 1 broadcast, all others share one length N."""
    lengths = _list_lengths(node)
    if not lengths or 0 in lengths:
        c.err(node, path, "a zip_override section needs non-empty lists to zip", at_key=True)
        return None
    other = {n for n in lengths if n != 1}
    if len(other) > 1:
        c.err(node, path, f"incompatible zip lengths {sorted(other)}: lists must share one length or have length 1", at_key=True)
        return None
    return other.pop() if other else 1


def _zip_slice(node: Node, i: int) -> Node:
    if node.is_list:
        return node.value[0 if len(node.value) == 1 else i]
    if node.is_map:
        return Node({k: _zip_slice(v, i) for k, v in node.value.items()}, node.line, node.column,
                    node.key_line, node.key_column, node.tag)
    return node


def _semantic(c: _Checker, root: Node) -> None:
    """Arithmetic, parallel sizes and engine flags on one complete recipe."""
    res = root.get("resources")
    gpn_node = res.get("gpus_per_node") if res is not None else None
    gpn = gpn_node.value if gpn_node is not None and _is_int(gpn_node.value) and gpn_node.value > 0 else 4
    if root.get("schema") is not None and root.get("schema").value == 2:
        eng = root.get("engine")
        top_type = eng.value if eng is not None and isinstance(eng.value, str) else (
            eng.get("type").value if eng is not None and eng.is_map and eng.get("type") is not None else None)
        roles = root.get("roles")
        if roles is None or not roles.is_map:
            return
        pre_gpus = None
        for name in S.ROLE_NAMES:
            role = roles.get(name)
            if role is None or not role.is_map:
                continue
            p = ("roles", name)
            share = pre_gpus if (name == "decode" and role.get("nodes") is not None and role.get("nodes").value == "colocate") else None
            nodes_node = role.get("nodes")
            if nodes_node is not None and nodes_node.value == "colocate":
                nodes_node = None
            per = c.fit(name, nodes_node, role.get("workers"), role.get("gpus"), gpn,
                        (p + ("nodes",), p + ("workers",), p + ("gpus",)), share)
            if name == "prefill":
                pre_gpus = per
            r_eng = role.get("engine")
            etype = top_type
            if r_eng is not None:
                etype = r_eng.value if isinstance(r_eng.value, str) else (r_eng.get("type").value if r_eng.is_map and r_eng.get("type") else None)
            c.parallel(etype or "", role.get("args"), per, p + ("args",), role)
            if etype == "vllm":
                c.flags(role.get("args"), p + ("args",), worker_command(_frontend_type(root)))
                c.env(role.get("env"), p + ("env",))
            else:
                c.unchecked(etype)
        if top_type == "vllm":
            c.env(root.get("environment"), ("environment",))
        return

    backend = root.get("backend")
    btype = "sglang"
    if backend is not None and backend.is_map and backend.get("type") is not None:
        btype = backend.get("type").value
    cfg_key = S.ENGINE_CONFIG_KEY.get(btype) if isinstance(btype, str) else None
    cfg = backend.get(cfg_key) if backend is not None and backend.is_map and cfg_key else None
    if res is None or not res.is_map:
        return
    g = res.get
    disagg = g("prefill_nodes") is not None or g("decode_nodes") is not None
    if disagg:
        pre = c.fit("prefill", g("prefill_nodes"), g("prefill_workers"), g("gpus_per_prefill"), gpn,
                    (("resources", "prefill_nodes"), ("resources", "prefill_workers"), ("resources", "gpus_per_prefill")))
        dec = c.fit("decode", g("decode_nodes"), g("decode_workers"), g("gpus_per_decode"), gpn,
                    (("resources", "decode_nodes"), ("resources", "decode_workers"), ("resources", "gpus_per_decode")), share_with=pre)
        dn = c._int(g("decode_nodes"))
        pn, pw, dw = c._int(g("prefill_nodes")), c._int(g("prefill_workers")), c._int(g("decode_workers"))
        if dn == 0 and pn and pw and dw and pre and dec and pw * pre + dw * dec > pn * gpn:
            c.err(g("decode_workers"), ("resources", "decode_workers"),
                  f"prefill {pw} x {pre} GPUs + decode {dw} x {dec} GPUs sharing {pn} node(s) x {gpn} GPUs do not fit")
        per_mode = {"prefill": pre, "decode": dec}
    else:
        agg = c.fit("agg", g("agg_nodes"), g("agg_workers"), g("gpus_per_agg"), gpn,
                    (("resources", "agg_nodes"), ("resources", "agg_workers"), ("resources", "gpus_per_agg")))
        per_mode = {"aggregated": agg}
    if cfg is not None and cfg.is_map:
        for mode, per in per_mode.items():
            args = cfg.get(mode)
            c.parallel(btype, args, per, ("backend", cfg_key, mode), args)
        if btype == "vllm":
            for mode in ("prefill", "decode", "aggregated"):
                c.flags(cfg.get(mode), ("backend", cfg_key, mode), worker_command(_frontend_type(root)))
    if btype != "vllm":
        c.unchecked(btype)
    if btype == "vllm" and backend is not None and backend.is_map:
        for env_key in ("prefill_environment", "decode_environment", "aggregated_environment"):
            c.env(backend.get(env_key), ("backend", env_key))
        c.env(root.get("environment"), ("environment",))


def _binding(c: _Checker, root: Node, header: str) -> None:
    model = root.get("model")
    cont = model.get("container") if model is not None and model.is_map else None
    if cont is None:
        return
    ref = cont.value
    if ref == UNBOUND_IMAGE:
        return
    problem = image_ref_problem(ref)
    if problem:
        c.err(cont, ("model", "container"), problem)
        return
    ident = root.get("identity")
    image = None
    if ident is not None and ident.is_map and ident.get("container") is not None and ident.get("container").is_map:
        image = ident.get("container").get("image")
    if image is None or image.value != ref:
        c.err(image or ident or cont, ("identity", "container", "image"), f"must name the same image as model.container ({ref})")
    if not re.search(r"^# lock-sha256: [0-9a-f]{64}$", header, re.M):
        c.err(None, ("lock-sha256",), "a bound recipe must record the stack's lock sha256 in its header ('# lock-sha256: <64 hex>')")


def validate_text(text: str, file: Path | str, engine: EngineSpec | None = None, *, require_digest: bool | None = None,
                  notes: list[str] | None = None) -> list[InputError]:
    """Every problem of one recipe; `notes`, when given, receives what could not be checked and why."""
    file = str(file)
    try:
        root = parse(text, file)
    except InputError as e:
        return [e]
    if not root.is_map:
        return [InputError(Location(file, root.line, root.column), "", "a recipe must be a YAML mapping")]
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    if require_digest is None:
        require_digest = text.startswith(RENDER_MARK)
    sweep = root.get("sweep") is not None or "zip_override_" in text or (
        root.get("benchmark") is not None and root.get("benchmark").is_map and root.get("benchmark").get("sweep") is not None)
    c = _Checker(file, engine, sweep)

    if "base" in root.value:
        base = root.get("base")
        spec = S.TOP_V2 if (base.is_map and base.get("schema") is not None) else S.TOP_V1
        required = S.REQUIRED_V2 if spec is S.TOP_V2 else S.REQUIRED_V1
        c.walk(base, spec, ("base",))
        variants: list[tuple[str, Node]] = []
        for key, over in root.value.items():
            if key == "base":
                continue
            if key.startswith("override_"):
                c.walk(over, spec, (key,), keys_only=True)
                if base.is_map and over.is_map:
                    variants.append((key, _merge(base, over)))
            elif key.startswith("zip_override_"):
                c.walk(over, spec, (key,), keys_only=True)
                if base.is_map and over.is_map:
                    n = _zip_length(c, over, (key,))
                    for i in range(n or 0):
                        variants.append((f"{key}[{i}]", _merge(base, _zip_slice(over, i))))
            else:
                c.err(over, (key,), "unknown key in an override recipe (expected base, override_<name> or zip_override_<name>)"
                      + _suggest(key, ["base", "override_", "zip_override_"]), at_key=True)
        if not variants and base.is_map:
            variants.append(("base", base))
        for name, variant in variants:
            c.variant = "" if name == "base" else f"[{name}]"
            c.walk(variant, spec, ())
            c.required(variant, required)
            _semantic(c, variant)
        c.variant = ""
        recipe = base
    else:
        schema_node = root.get("schema")
        if schema_node is not None and schema_node.value not in (1, 2):
            c.err(schema_node, ("schema",), f"unsupported recipe schema {schema_node.value!r} (srt-slurm knows 1 and 2)")
            return c.errors
        v2 = schema_node is not None and schema_node.value == 2
        spec = S.TOP_V2 if v2 else S.TOP_V1
        c.walk(root, spec, ())
        c.required(root, S.REQUIRED_V2 if v2 else S.REQUIRED_V1)
        _semantic(c, root)
        recipe = root
    if require_digest and recipe.is_map:
        _binding(c, recipe, header)
    # de-duplicate (an override can re-report its base)
    seen, out = set(), []
    for e in c.errors:
        if str(e) not in seen:
            seen.add(str(e))
            out.append(e)
    if notes is not None:
        notes.extend(n for n in c.notes if n not in notes)
    return out


EngineChoice = Callable[[Path, str], EngineSpec]


def recipe_files(paths: Iterable[Path | str]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.suffix in (".yaml", ".yml") and q.is_file()))
        else:
            out.append(p)
    return out


def validate_paths(paths: Iterable[Path | str], engine: EngineSpec | Path | str | EngineChoice | None = None, *,
                   require_digest: bool | None = None, notes: list[str] | None = None) -> list[InputError]:
    """Validate recipe files (directories are searched for *.yaml/*.yml). Returns every error found.

    `engine` is an EngineSpec, the path of a pins/<stack>.engine.json, or a function choosing one per
    file from its path and text (raising InputError when it cannot); None checks no engine flags.
    `require_digest`: True demands an unbound placeholder or a digest in model.container; None (the
    default) demands it of files rendered by servestack only.
    """
    fixed = load_engine(engine) if isinstance(engine, (str, Path)) else engine
    errors: list[InputError] = []
    for f in recipe_files(paths):
        try:
            text = f.read_text()
        except OSError as e:
            errors.append(InputError(f, "", f"cannot read: {e}"))
            continue
        spec = fixed
        if callable(fixed) and not isinstance(fixed, EngineSpec):
            try:
                spec = fixed(f, text)
            except InputError as e:
                errors.append(e)
                continue
        errors.extend(validate_text(text, f, spec, require_digest=require_digest, notes=notes))
    return errors
