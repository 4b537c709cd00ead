"""Prefill and decode against the engine's NIXL rules (kvrules.py): what they must agree on to exchange KV.

vLLM compares its compatibility hash only at the first request, and nothing compares the SSM state's
dtype or layout at all: a recipe whose roles differ there reaches a GB200 allocation, loads the
model on every node, then fails or answers wrong. Here the difference is found in the file, with
both lines and the engine's reason:

  * `equal` rules: a difference is an error; one under a condition the recipe cannot show (the
    engine's `self._has_mamba`, say) is a warning naming the condition;
  * `value` rules: both roles must set the value the engine asserts;
  * `heterogeneous` rules: the engine accepts a difference, so it passes silently;
  * COST_ONLY: settings no rule covers whose difference works but costs, a warning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servestack.recipes.kvrules import KvRule
from servestack.recipes.roles import Found, Role, roles
from servestack.recipes.structure import Checker


@dataclass(frozen=True, kw_only=True)
class CostOnly:
    setting: str
    cost: str


# Not read by any NIXL check, so the engine pairs the roles anyway; the reason each costs.
COST_ONLY = (
    CostOnly(setting="flag:async-scheduling",
             cost="the engine pairs the roles anyway (no NIXL hash factor or handshake check reads it), but the role "
                  "without it schedules each step only after the last one finishes, and the pair runs two scheduling "
                  "paths to verify (async scheduling on a race-prone build zeroed GSM8K in vLLM #42182)"),
)


def _uses_nixl(pair: list[Role]) -> bool:
    """srt-slurm's vLLM roles exchange KV through NIXL unless a kv-transfer-config names another connector."""
    connectors = {r.setting("json:kv-transfer-config.kv_connector").value for r in pair}
    return all(c is None or "Nixl" in str(c) for c in connectors)


def _shown(found: Found) -> str:
    return "nothing (the engine's default)" if found.value is None else repr(found.value)


def _reason(rule: KvRule) -> str:
    when = f" when {rule.condition}" if rule.condition else ""
    return f"{rule.reason} ({rule.source}{when})"


def check_roles(c: Checker, root: Any) -> None:
    if c.engine is None or not c.engine.kv_rules or c.judged:
        return  # judged: the engine's own hash on the resolved roles decides (judged.py), not these rules
    by_name = roles(root)
    if "prefill" not in by_name or "decode" not in by_name:
        return
    prefill, decode = by_name["prefill"], by_name["decode"]
    if {prefill.engine, decode.engine} != {c.engine.engine}:
        return
    if not _uses_nixl([prefill, decode]):
        p, d = (r.setting("json:kv-transfer-config.kv_connector") for r in (prefill, decode))
        if p.value != d.value:
            c.err(d.node, d.path, f"the roles name different KV connectors: prefill {_shown(p)} (line {c.line(p.node)}), "
                                  f"decode {_shown(d)} (line {c.line(d.node)}), so no KV moves between them; name one "
                                  "connector in both kv-transfer-config values")
        return
    checked: set[str] = set()
    for rule in c.engine.kv_rules:
        for setting in rule.settings:
            if setting in checked:
                continue  # one rule per setting: the hash's (unconditional) before the handshake's
            checked.add(setting)
            _apply(c, rule, setting, prefill, decode)
    for cost in COST_ONLY:
        if cost.setting in checked:
            continue
        p, d = prefill.setting(cost.setting), decode.setting(cost.setting)
        if _norm(p.value) != _norm(d.value):
            c.warn(d.node, d.path,
                   f"{cost.setting.partition(':')[2]} differs: prefill sets {_shown(p)} (line {c.line(p.node)}), decode sets {_shown(d)} "
                                   f"(line {c.line(d.node)}): {cost.cost}")


def _norm(value: Any) -> Any:
    return None if value is False or value is None else str(value)


def _apply(c: Checker, rule: KvRule, setting: str, prefill: Role, decode: Role) -> None:
    p, d = prefill.setting(setting), decode.setting(setting)
    name = setting.partition(":")[2]
    if rule.policy == "value":
        wrong = [(role, f) for role, f in (("prefill", p), ("decode", d)) if f.value != rule.value]
        if wrong:
            _, f = wrong[0]
            c.err(f.node, f.path, f"{name} must be {rule.value!r} on both roles exchanging KV; prefill sets {_shown(p)} "
                                  f"(line {c.line(p.node)}), decode sets {_shown(d)} (line {c.line(d.node)}): "
                                  f"{_reason(rule)}")
        return
    if rule.policy != "equal" or p.value == d.value:
        return
    problem = (f"{name} differs between the roles exchanging KV over NIXL: prefill sets {_shown(p)} "
               f"(line {c.line(p.node)}), decode sets {_shown(d)} (line {c.line(d.node)}); the engine requires them "
               f"equal: {_reason(rule)}")
    if rule.condition:
        c.warn(d.node, d.path, problem)
    else:
        c.err(d.node, d.path, problem)
