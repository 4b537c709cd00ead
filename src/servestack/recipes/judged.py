"""What srt-slurm's launch and the engine's answers (judge.py) mean for one recipe file, each at its line.

  * srt-slurm's loader refuses the file: its own message;
  * srt-slurm would install its default Dynamo over the image's (no `dynamo.install: false`);
  * vLLM or Dynamo refuses a role's resolved command line or environment: the engine's own message, at
    the line that set the value it names;
  * the roles register different served model names (srt-slurm passes the first role's, then the role's own);
  * the roles name different KV connectors, or vLLM's NIXL compatibility hashes differ: each differing
    factor with both lines and the value that would make them agree;
  * an environment value the NIXL worker asserts ("Set VLLM_X=V"), as the role will see it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from servestack.errors import InputError
from servestack.recipes.engine_cli import EngineSpec
from servestack.recipes.judge import Launch
from servestack.recipes.roles import Found, Role, roles
from servestack.recipes.structure import Checker
from servestack.util.yamlfile import Node, parse

HASH_SOURCE = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py:compute_nixl_compatibility_hash"


def _flag_of(message: str, role: Role) -> Found | None:
    """The recipe's setting a message of the engine names (its dest `max_num_seqs` or flag `--max-num-seqs`)."""
    for key in sorted(role.args, key=len, reverse=True):
        flag = key.replace("_", "-").removeprefix("no-")
        if re.search(rf"(?<![\w-])({re.escape(flag)}|{re.escape(flag.replace('-', '_'))})(?![\w-])", message):
            return role.flag(flag) if role.flag(flag).value is not None else role.flag(key.replace("_", "-"))
    for name, (node, path) in role.env.items():
        if name in message:
            return Found(value=node.value, node=node, path=path)
    return None


def check_file(file: Path, text: str, launch: Launch, answers: dict[str, dict], engine: EngineSpec | None) -> list[InputError]:
    root = parse(text, str(file))
    c = Checker(str(file), engine, False)
    if launch.error:
        c.err(root, (), f"srt-slurm {_pin()} refuses to launch it: {launch.error}")
        return c.errors
    _dynamo(c, root, launch)
    by_name = roles(root)
    for mode, answer in answers.items():
        role = by_name.get(mode)
        if role is None or answer.get("ok"):
            continue
        found = _flag_of(answer.get("error", ""), role)
        node, path = (found.node, found.path) if found else (role.node, role.path)
        what = "Dynamo's and vLLM's parsers" if answer.get("stage") == "parse" else "vLLM's engine configuration"
        c.err(node, path, f"the {mode} role, as srt-slurm starts it, is refused by {what}: {answer.get('error')}")
    prefill, decode = by_name.get("prefill"), by_name.get("decode")
    p, d = answers.get("prefill"), answers.get("decode")
    if prefill and decode and p and d and p.get("ok") and d.get("ok"):
        _served(c, prefill, decode, p, d)
        if not _connectors(c, prefill, decode, p, d):
            _hashes(c, prefill, decode, p, d)
    if engine is not None:
        _asserted_env(c, by_name, launch, engine)
    return c.errors


def _pin() -> str:
    from servestack.recipes.srtslurm import SRT_SLURM

    return SRT_SLURM.tag


def _dynamo(c: Checker, root: Node, launch: Launch) -> None:
    block = root.get("dynamo")
    install = block.get("install") if block is not None and block.is_map else None
    if launch.installs_dynamo and install is None:
        c.err(block or root, ("dynamo", "install"),
              f"srt-slurm {_pin()} installs its default Dynamo {launch.dynamo_version} over the image's at every worker "
              "start, so the image's Dynamo, the one these flags are checked against, never runs: add "
              "`dynamo:` with `install: false` (srtctl/core/schema.py: DynamoConfig.install defaults to true)")


def _served(c: Checker, prefill: Role, decode: Role, p: dict, d: dict) -> None:
    if p.get("served_model_name") == d.get("served_model_name"):
        return
    pf, df = prefill.flag("served-model-name"), decode.flag("served-model-name")
    c.err(df.node, df.path,
          f"prefill registers the model as {p.get('served_model_name')!r} (line {c.line(pf.node)}), decode as "
          f"{d.get('served_model_name')!r} (line {c.line(df.node)}): srt-slurm passes the first role's name to every "
          "worker, then the role's own, which vLLM keeps, and the benchmark asks for one name; set served-model-name to "
          f"{p.get('served_model_name')!r} on both (srtctl/backends/vllm.py: get_served_model_name)")


def _connectors(c: Checker, prefill: Role, decode: Role, p: dict, d: dict) -> bool:
    if p.get("connector") == d.get("connector"):
        return False
    pf, df = prefill.flag("kv-transfer-config"), decode.flag("kv-transfer-config")
    c.err(df.node, df.path,
          f"the roles name different KV connectors: prefill {p.get('connector')!r} (line {c.line(pf.node)}), decode "
          f"{d.get('connector')!r} (line {c.line(df.node)}), so no KV moves between them; set kv_connector to "
          f"{p.get('connector')!r} in both kv-transfer-config values")
    return True


def _settings(engine_rules: Any, factor: str) -> tuple[str, ...]:
    for rule in engine_rules or ():
        if rule.kind == "hash" and rule.name == factor:
            return rule.settings
    return ()


def _said(value: Any) -> str:
    return "unset (vLLM's default)" if value is None else repr(value)


def _hashes(c: Checker, prefill: Role, decode: Role, p: dict, d: dict) -> None:
    if p.get("hash") == d.get("hash"):
        return
    pf, df = p.get("factors") or {}, d.get("factors") or {}
    for factor in sorted(set(pf) | set(df)):
        if pf.get(factor) == df.get(factor):
            continue
        flags = [s for s in _settings(c.engine.kv_rules if c.engine else (), factor) if s.startswith(("flag:", "env:"))]
        spots = [(s, prefill.setting(s), decode.setting(s)) for s in flags]
        named = [(s, a, b) for s, a, b in spots if a.value is not None or b.value is not None] or spots[:1]
        where = "; ".join(f"{s.partition(':')[2]} is {_said(a.value)} on prefill (line {c.line(a.node)}) and "
                          f"{_said(b.value)} on decode (line {c.line(b.node)})" for s, a, b in named)
        target = named[0][2] if named else Found(value=None, node=decode.node, path=decode.path)
        c.err(target.node, target.path,
              f"the roles cannot exchange KV: vLLM resolves {factor} to {pf.get(factor)!r} on prefill and "
              f"{df.get(factor)!r} on decode, and NIXL's handshake refuses differing compatibility hashes at the first "
              f"request; make decode resolve it to {pf.get(factor)!r}" + (f" ({where})" if where else "")
              + f" (source: {HASH_SOURCE})")


def _asserted_env(c: Checker, by_name: dict[str, Role], launch: Launch, engine: EngineSpec) -> None:
    for rule in engine.kv_rules:
        if rule.kind != "state" or rule.policy != "value" or not rule.settings[0].startswith("env:"):
            continue
        name = rule.settings[0].partition(":")[2]
        wrong: dict[tuple[int | None, tuple[str, ...]], list[str]] = {}
        spots: dict[tuple[int | None, tuple[str, ...]], tuple[Node | None, str]] = {}
        for mode, worker in launch.roles.items():
            value = worker.env.get(name)
            role = by_name.get(mode)
            if value is None or value == rule.value or role is None or mode == "agg":
                continue
            node, path = role.env.get(name, (role.node, role.path))
            spot = (id(node), path)
            wrong.setdefault(spot, []).append(mode)
            spots[spot] = (node, value)
        for (_, path), modes in wrong.items():
            node, value = spots[(_, path)]
            shared = path[:1] == ("environment",)
            c.err(node, path, f"the {' and '.join(modes)} worker(s) start with {name}={value} (line {c.line(node)}"
                              + ("; srt-slurm applies the top-level environment after each role's, so it wins" if shared
                                 else "") + f"), and vLLM's NIXL worker asserts {name}={rule.value}: set it to "
                              f"{rule.value} on line {c.line(node)} (source: {rule.source})")
