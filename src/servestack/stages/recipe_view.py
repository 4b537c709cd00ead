"""What the stages need from an srt-slurm recipe (recipes/<stack>/<name>.yaml).

The recipe model and its validation belong to servestack.recipes; the stages only read a few
fields, tolerantly, so that they work with any recipe the validator accepts:

  name; model.path, model.served_model_name (default: the server's served-model-name flag, else name); resources.gpus_per_node with
  agg_nodes | prefill_nodes + decode_nodes (GPUs of the deployment, >= 1: a CPU deployment counts
  as one device); backend.type (vllm); backend.vllm_config.aggregated (server flags: {flag: value},
  True = bare flag, False/None = omitted, list = repeated values); backend.aggregated_environment;
  benchmark.{type, isl, osl, concurrencies (list or "4x8x16"), num_prompts_mult, req_rate}.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError
from ..recipes.validate import concurrency_list


def _get(data: Any, *keys: str, default: Any = None) -> Any:
    for k in keys:
        if not isinstance(data, dict) or k not in data:
            return default
        data = data[k]
    return data


def parse_concurrencies(value: Any, where: Path) -> list[int]:
    """benchmark.concurrencies as the recipe validator reads it (none: an empty list)."""
    if value is None:
        return []
    try:
        return concurrency_list(value)
    except ValueError as e:
        raise InputError(where, "benchmark.concurrencies", str(e)) from None


@dataclass(frozen=True)
class RecipeView:
    file: Path
    name: str
    model_path: str
    served_model_name: str
    gpus: int
    backend: str
    server_flags: dict[str, Any]
    server_env: dict[str, str]
    benchmark: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    gpu_type: str = ""

    @property
    def accelerators(self) -> int:
        """GPUs to request from the scheduler: none for a CPU deployment (gpu_type: cpu), which
        still counts as one device when throughput is normalized per GPU."""
        return 0 if self.gpu_type.lower() == "cpu" else self.gpus

    @property
    def concurrencies(self) -> list[int]:
        return parse_concurrencies(self.benchmark.get("concurrencies"), self.file)

    @classmethod
    def load(cls, file: Path) -> "RecipeView":
        file = Path(file)
        try:
            data = yaml.safe_load(file.read_text())
        except FileNotFoundError:
            raise InputError(file, "", "recipe not found") from None
        except yaml.YAMLError as exc:
            raise InputError(file, "", f"not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise InputError(file, "", "a recipe is a YAML mapping")
        name = str(data.get("name") or file.stem)
        res = data.get("resources") or {}
        gpn = int(res.get("gpus_per_node") or 0)
        if res.get("prefill_nodes") or res.get("decode_nodes"):
            nodes = int(res.get("prefill_nodes") or 0) + int(res.get("decode_nodes") or 0)
        else:
            nodes = int(res.get("agg_nodes") or 1)
        gpus = max(1, nodes * gpn)
        backend = data.get("backend") or {}
        btype = str(backend.get("type") or "vllm")
        cfg = backend.get(f"{btype}_config") or {}
        flags = cfg.get("aggregated") or cfg.get("agg") or {}
        if not isinstance(flags, dict):
            raise InputError(file, f"backend.{btype}_config.aggregated", "expected a mapping of server flags")
        env = backend.get("aggregated_environment") or {}
        # Disaggregated recipes name the model per worker kind (prefill/decode): any of them will do.
        section_names = [s.get("served-model-name") for s in cfg.values() if isinstance(s, dict)] \
            if isinstance(cfg, dict) else []
        flags_name = flags.get("served-model-name") or flags.get("served_model_name") or next(
            (n for n in section_names if n), None)
        model = data.get("model") or {}
        return cls(
            file=file, name=name, model_path=str(model.get("path") or ""),
            served_model_name=str(model.get("served_model_name") or data.get("served_model_name")
                                  or flags_name or name),
            gpus=gpus, backend=btype, server_flags=dict(flags),
            server_env={str(k): str(v) for k, v in env.items()},
            benchmark=dict(data.get("benchmark") or {}), raw=data, gpu_type=str(res.get("gpu_type") or ""),
        )
