"""Reading an srt-slurm recipe (recipes/<stack>/<name>.yaml): the one reader, and what the rest of servestack reads from it.

The validator (validate.py) checks every key against the schema; everything else reads recipes
through here, with positions, so their errors name file:line:column too:

  * `load_recipe`: the file as a positioned YAML document (a mapping, else an error);
  * `engine_settings`: every engine flag and VLLM_* variable a recipe sets, with where (smoke
    checks them against the image's vLLM);
  * `RecipeView`: the few fields the stages need (tolerant, so any recipe the validator accepts
    works): name; model.path, model.served_model_name (default: the server's served-model-name
    flag, else name); resources.gpus_per_node with agg_nodes | prefill_nodes + decode_nodes (GPUs
    of the deployment, >= 1: a CPU deployment counts as one device); backend.type (vllm);
    backend.vllm_config.aggregated (server flags: {flag: value}, True = bare flag, False/None =
    omitted, list = repeated values); backend.aggregated_environment; benchmark.{type, isl, osl,
    concurrencies (list or "4x8x16"), num_prompts_mult, req_rate}.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack.errors import InputError
from servestack.recipes.schema import deployment_shape
from servestack.recipes.structure import concurrency_list
from servestack.util.yamlfile import Document, load

_PLACEHOLDER = re.compile(r"\{\s*[A-Za-z_][\w.-]*\s*\}")


def load_recipe(file: Path | str) -> Document:
    """The recipe file as a positioned document whose data is a mapping."""
    document = load(Path(file))
    if not isinstance(document.data, dict):
        raise InputError(document.location(()), "", "a recipe is a YAML mapping")
    return document


@dataclass(frozen=True, kw_only=True)
class EngineSetting:
    kind: str  # "flag" (an engine command-line flag) or "env" (a VLLM_* environment variable)
    name: str
    value: Any  # None: not checkable (unset, or a sweep placeholder)
    where: str  # the dotted path of the mapping that sets it


def _checkable(value: Any) -> Any:
    return None if isinstance(value, str) and _PLACEHOLDER.search(value) else value


def engine_settings(data: dict[str, Any]) -> list[EngineSetting]:
    """Every engine flag (`<engine>_config.<role>` and `roles.<role>.args` mappings) and every VLLM_*
    variable (`environment`, `env` and `*_environment` mappings) a recipe's data sets, in file order."""
    found: list[EngineSetting] = []

    def walk(node: Any, where: tuple[str, ...]) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, (*where, str(i)))
            return
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            key = str(key)
            here = (*where, key)
            parent = where[-1] if where else ""
            grand = where[-2] if len(where) > 1 else ""
            flags = (parent == "vllm_config" or (grand == "roles" and key == "args")) and isinstance(value, dict)
            if flags:
                found.extend(EngineSetting(kind="flag", name=str(f), value=_checkable(v), where=".".join(here)) for f, v in value.items())
            elif (key.endswith("_environment") or key in ("environment", "env")) and isinstance(value, dict):
                found.extend(EngineSetting(kind="env", name=str(n), value=None if v is None else _checkable(str(v)), where=".".join(here))
                             for n, v in value.items() if str(n).startswith("VLLM_"))
            else:
                walk(value, here)

    walk(data, ())
    return found


@dataclass(frozen=True, kw_only=True)
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
    document: Document | None = field(default=None, compare=False, repr=False)

    @property
    def accelerators(self) -> int:
        """GPUs to request from the scheduler: none for a CPU deployment (gpu_type: cpu), which
        still counts as one device when throughput is normalized per GPU."""
        return 0 if self.gpu_type.lower() == "cpu" else self.gpus

    @property
    def shape(self) -> str:
        """'aggregated' or 'disaggregated' (prefill and decode workers behind Dynamo's frontend)."""
        return deployment_shape(self.raw.get("resources"))

    @property
    def concurrencies(self) -> list[int]:
        """benchmark.concurrencies as the recipe validator reads it (none: an empty list)."""
        value = self.benchmark.get("concurrencies")
        if value is None:
            return []
        try:
            return concurrency_list(value)
        except ValueError as e:
            where = self.document.location(("benchmark", "concurrencies")) if self.document else self.file
            raise InputError(where, "benchmark.concurrencies", str(e)) from None

    @classmethod
    def load(cls, file: Path) -> RecipeView:
        file = Path(file)
        document = load_recipe(file)
        data = document.data
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
            path = ("backend", f"{btype}_config", "aggregated" if cfg.get("aggregated") else "agg")
            raise document.error(path, "expected a mapping of server flags")
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
            document=document,
        )
