"""The CPU attention ISA section: with the image's environment, vLLM's CPU attention stays off its AMX
kernels even on a CPU that has AMX (the dev-cpu stack's local patch vllm-cpu-attn-no-amx.diff).

No AMX CPU is needed: vLLM asks torch whether the CPU has AMX tiles, and the check asks vLLM's own
ISA choice on a CPU that answers yes, with the image's SERVESTACK_CPU_ATTN_NO_AMX and without it
(where vLLM must pick AMX: the simulation is real)."""

from __future__ import annotations

import os

from .report import FAIL, PASS, check

VARIABLE = "SERVESTACK_CPU_ATTN_NO_AMX"


def section_cpu_isa(config: dict) -> list[dict]:
    import torch
    from vllm.v1.attention.backends import cpu_attn

    image_value = os.environ.get(VARIABLE)
    torch.cpu._is_amx_tile_supported = lambda: True  # a CPU with AMX, as vLLM asks
    chosen = {}
    for label, value in (("image", image_value), ("unset", None)):
        if value is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = value
        chosen[label] = cpu_attn._get_attn_isa(torch.bfloat16, 32, 64)
    seen = f"{VARIABLE}={image_value!r} in the image: {chosen['image']}; unset: {chosen['unset']}"
    if chosen["unset"] != "amx":
        return [check("cpu-isa:attention", FAIL, f"on a simulated AMX CPU vLLM did not pick AMX even without the variable "
                      f"({seen}): the check cannot tell the patch works")]
    if chosen["image"] == "amx":
        return [check("cpu-isa:attention", FAIL, f"bfloat16 attention takes the AMX kernels on an AMX CPU ({seen}), where a "
                      "disaggregated decode worker died on SIGILL after a NIXL pull")]
    return [check("cpu-isa:attention", PASS, f"on a simulated AMX CPU bfloat16 attention takes {chosen['image']!r}, not AMX ({seen})")]
