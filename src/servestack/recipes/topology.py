"""A complete recipe's arithmetic: workers x GPUs per worker fit the nodes, a worker spanning nodes uses whole
nodes, the engine's parallel sizes make up each worker's GPUs; and which engine checks (flags.py) apply where."""

from __future__ import annotations

from servestack.recipes import schema as S
from servestack.recipes.flags import check_env, check_flags, frontend_type, worker_command
from servestack.recipes.structure import Checker, is_int
from servestack.util.yamlfile import Node


def fit(c: Checker, role: str, nodes_n: Node | None, workers_n: Node | None, gpus_n: Node | None,
        gpn: int, paths: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], share_with: int | None = None) -> int | None:
    """Check one role's topology; returns the GPUs per worker (None when unknown)."""
    nodes, workers, per = c.int_value(nodes_n), c.int_value(workers_n), c.int_value(gpus_n)
    for n, v, p, lo in ((nodes_n, nodes, paths[0], 0), (workers_n, workers, paths[1], 1), (gpus_n, per, paths[2], 1)):
        if v is not None and v < lo:
            c.err(n, p, f"must be at least {lo}, got {v}")
            return None
    if per is None:
        if nodes and workers:
            per = (nodes * gpn) // workers
            if per == 0:
                c.err(workers_n, paths[1], f"{workers} workers cannot share {nodes} node(s) x {gpn} GPUs")
                return None
        elif nodes == 0 and share_with is not None:
            per = share_with
        else:
            per = gpn
    if per > gpn and per % gpn:
        c.err(gpus_n or workers_n or nodes_n, paths[2], f"a {role} worker of {per} GPUs spans nodes of {gpn} GPUs but not whole nodes")
    if nodes and workers:
        need, have = workers * per, nodes * gpn
        if need > have:
            c.err(workers_n, paths[1],
                  f"{workers} {role} worker(s) x {per} GPUs = {need} GPUs do not fit in {nodes} node(s) x {gpn} GPUs = {have} GPUs")
    return per


def parallel(c: Checker, engine_type: str, args: Node | None, per: int | None, where: tuple[str, ...], anchor: Node | None) -> None:
    if per is None or args is None or not args.is_map:
        return
    a = args.value

    def size(*names: str) -> tuple[int, Node | None, str]:
        """(the size, its node, the key as spelled); 1, None and "" where the recipe leaves it out."""
        for name in names:
            for spelled in (name, name.replace("-", "_"), name.replace("_", "-")):
                if spelled in a:
                    n = a[spelled]
                    return (n.value if is_int(n.value) else -1), n, spelled
        return 1, None, ""

    if engine_type == "vllm":
        tp, tpn, tpk = size("tensor-parallel-size", "tp")
        pp, ppn, _ = size("pipeline-parallel-size", "pp")
        dp, dpn, dpk = size("data-parallel-size", "dp")
        if -1 in (tp, pp, dp):
            return
        if "data-parallel-start-rank" in a or "headless" in a:
            return  # a DP rank group launched by hand: the product spans several srt-slurm workers
        # data-parallel-size-local is no escape: srt-slurm v1.0.68 drops it and derives it from the
        # allocation (srtctl/backends/vllm.py: build_worker_command, per_node), so DP must fit the worker.
        world = tp * pp * dp
        if world != per:
            culprit = dpn or tpn or ppn or anchor
            key = dpk or tpk or "tensor-parallel-size"
            c.err(culprit, where + (key,),
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
            c.err(tpn or ppn or anchor, where + (tpk or "tp-size",),
                  f"{shown} parallel = {world} GPUs, but each worker has {per} GPUs")
        if dp_attention and dpn is not None and tp % dp:
            c.err(dpn, where + (dpk,), f"data parallel size {dp} does not divide tensor parallel size {tp}")
        if epn is not None and tp % ep:
            c.err(epn, where + (epk,), f"expert parallel size {ep} does not divide tensor parallel size {tp}")
    elif engine_type == "trtllm":
        tp, tpn, tpk = size("tensor_parallel_size")
        pp, ppn, _ = size("pipeline_parallel_size")
        cp, _, _ = size("context_parallel_size")
        ep, epn, epk = size("moe_expert_parallel_size")
        if -1 in (tp, pp, cp, ep):
            return
        world = tp * pp * cp
        if world != per:
            c.err(tpn or ppn or anchor, where + (tpk or "tensor_parallel_size",),
                  f"tensor {tp} x pipeline {pp} x context {cp} parallel = {world} GPUs, but each worker has {per} GPUs")
        if epn is not None and ep > 0 and tp % ep:
            c.err(epn, where + (epk,), f"expert parallel size {ep} does not divide tensor parallel size {tp}")


def check_recipe(c: Checker, root: Node) -> None:
    """Arithmetic, parallel sizes and engine flags on one complete recipe."""
    res = root.get("resources")
    gpn_node = res.get("gpus_per_node") if res is not None else None
    gpn = gpn_node.value if gpn_node is not None and is_int(gpn_node.value) and gpn_node.value > 0 else 4
    schema = root.get("schema")
    if schema is not None and schema.value == 2:
        eng = root.get("engine")
        eng_type = eng.get("type") if eng is not None and eng.is_map else None
        top_type = eng.value if eng is not None and isinstance(eng.value, str) else (
            eng_type.value if eng_type is not None else None)
        roles = root.get("roles")
        if roles is None or not roles.is_map:
            return
        pre_gpus = None
        for name in S.ROLE_NAMES:
            role = roles.get(name)
            if role is None or not role.is_map:
                continue
            p = ("roles", name)
            nodes_node = role.get("nodes")
            colocated = nodes_node is not None and nodes_node.value == "colocate"
            share = pre_gpus if (name == "decode" and colocated) else None
            if colocated:
                nodes_node = None
            per = fit(c, name, nodes_node, role.get("workers"), role.get("gpus"), gpn,
                        (p + ("nodes",), p + ("workers",), p + ("gpus",)), share)
            if name == "prefill":
                pre_gpus = per
            r_eng = role.get("engine")
            etype = top_type
            if r_eng is not None:
                r_type = r_eng.get("type") if r_eng.is_map else None
                etype = r_eng.value if isinstance(r_eng.value, str) else (r_type.value if r_type is not None else None)
            parallel(c, etype or "", role.get("args"), per, p + ("args",), role)
            if etype == "vllm":
                check_flags(c, role.get("args"), p + ("args",), worker_command(frontend_type(root)))
                check_env(c, role.get("env"), p + ("env",))
            else:
                c.unchecked(etype)
        if top_type == "vllm":
            check_env(c, root.get("environment"), ("environment",))
        return

    backend = root.get("backend")
    btype = "sglang"
    type_node = backend.get("type") if backend is not None and backend.is_map else None
    if type_node is not None:
        btype = type_node.value
    cfg_key = S.ENGINE_CONFIG_KEY.get(btype) if isinstance(btype, str) else None
    cfg = backend.get(cfg_key) if backend is not None and backend.is_map and cfg_key else None
    if res is None or not res.is_map:
        return
    g = res.get
    disagg = S.deployment_shape({k: g(k) for k in S.DISAGGREGATED_KEYS}) == "disaggregated"
    if disagg:
        pre = fit(c, "prefill", g("prefill_nodes"), g("prefill_workers"), g("gpus_per_prefill"), gpn,
                    (("resources", "prefill_nodes"), ("resources", "prefill_workers"), ("resources", "gpus_per_prefill")))
        dec = fit(c, "decode", g("decode_nodes"), g("decode_workers"), g("gpus_per_decode"), gpn,
                    (("resources", "decode_nodes"), ("resources", "decode_workers"), ("resources", "gpus_per_decode")), share_with=pre)
        dn = c.int_value(g("decode_nodes"))
        pn, pw, dw = c.int_value(g("prefill_nodes")), c.int_value(g("prefill_workers")), c.int_value(g("decode_workers"))
        if dn == 0 and pn and pw and dw and pre and dec and pw * pre + dw * dec > pn * gpn:
            c.err(g("decode_workers"), ("resources", "decode_workers"),
                  f"prefill {pw} x {pre} GPUs + decode {dw} x {dec} GPUs sharing {pn} node(s) x {gpn} GPUs do not fit")
        per_mode = {"prefill": pre, "decode": dec}
    else:
        agg = fit(c, "agg", g("agg_nodes"), g("agg_workers"), g("gpus_per_agg"), gpn,
                    (("resources", "agg_nodes"), ("resources", "agg_workers"), ("resources", "gpus_per_agg")))
        per_mode = {"aggregated": agg}
    if cfg_key and cfg is not None and cfg.is_map:
        for mode, per in per_mode.items():
            args = cfg.get(mode)
            parallel(c, btype, args, per, ("backend", cfg_key, mode), args)
        if btype == "vllm":
            for mode in ("prefill", "decode", "aggregated"):
                check_flags(c, cfg.get(mode), ("backend", cfg_key, mode), worker_command(frontend_type(root)))
    if btype != "vllm":
        c.unchecked(btype)
    if btype == "vllm" and backend is not None and backend.is_map:
        for env_key in ("prefill_environment", "decode_environment", "aggregated_environment"):
            check_env(c, backend.get(env_key), ("backend", env_key))
        check_env(c, root.get("environment"), ("environment",))
