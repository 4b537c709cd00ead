#!/usr/bin/env python3
"""A stand-in for srt-slurm's `srtctl` (which cannot be installed here), for tests only.

It keeps srtctl's command line and output contract (srt-slurm src/srtctl/cli/submit.py):
  srtctl apply -f RECIPE [-o OUTPUT_BASE] [--json] [-y]
submits a REAL Slurm job with sbatch, creates OUTPUT_BASE/<job id>/ with config.yaml,
sbatch_script.sh, <job id>.json and logs/, prints one JSON line per submission with --json
({"status": "submitted", "slurm_job_id", "job_name", "output_dir", "metadata_path", "config_path",
"tags"}), else "Job <id> submitted!" / "Logs: <dir>/logs".
The job writes sa-bench-style results, one per concurrency in benchmark.concurrencies, to
logs/sa-bench_isl_<ISL>_osl_<OSL>/results_concurrency_<C>_gpus_<G>.json with vLLM's result keys
(synthetic numbers: there is no model server behind the stand-in), sleeping
STANDIN_SECONDS_PER_POINT (default 1) before each; for benchmark.type gsm8k it writes
logs/gsm8k_results.json like srt-slurm's gsm8k_eval.py --save-results.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

JOB = r'''
import json, os, sys, time
from pathlib import Path
cfg = json.loads(Path(sys.argv[1]).read_text())
logs = Path(cfg["logs"])
b = cfg["benchmark"]
pause = float(os.environ.get("STANDIN_SECONDS_PER_POINT", "1"))
if b.get("type") == "gsm8k":
    time.sleep(pause)
    (logs / "gsm8k_results.json").write_text(json.dumps({"accuracy": 0.9, "invalid_rate": 0.0, "latency": 1.0,
        "num_questions": b.get("num_examples", 1319), "num_shots": 5, "max_tokens": 512}))
    sys.exit(0)
d = logs / f"sa-bench_isl_{b['isl']}_osl_{b['osl']}"
d.mkdir(parents=True, exist_ok=True)
for c in b["concurrencies"]:
    time.sleep(pause)
    n = c * 10
    out = n * b["osl"]
    res = {"backend": "dynamo", "num_prompts": n, "max_concurrency": c, "request_rate": "inf",
           "duration": 10.0, "completed": n, "failed": 0, "total_input_tokens": n * b["isl"],
           "total_output_tokens": out, "request_throughput": n / 10.0, "output_throughput": out / 10.0,
           "total_token_throughput": (out + n * b["isl"]) / 10.0, "median_ttft_ms": 50.0,
           "median_tpot_ms": 5.0 + c / 10.0, "median_itl_ms": 5.0, "p99_ttft_ms": 90.0}
    tmp = d / f".tmp_{c}"
    tmp.write_text(json.dumps(res))
    tmp.rename(d / f"results_concurrency_{c}_gpus_{cfg['gpus']}.json")
'''


def main() -> int:
    ap = argparse.ArgumentParser(prog="srtctl")
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("apply")
    a.add_argument("-f", "--file", required=True, dest="config")
    a.add_argument("-o", "--output", type=Path, dest="output_dir")
    a.add_argument("--json", action="store_true", dest="json_output")
    a.add_argument("-y", "--yes", action="store_true")
    a.add_argument("--tags")
    args = ap.parse_args()
    recipe_path = Path(args.config)
    recipe = yaml.safe_load(recipe_path.read_text())
    base = (args.output_dir or Path("outputs")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    res = recipe.get("resources") or {}
    gpus = max(1, int(res.get("agg_nodes") or 1) * int(res.get("gpus_per_node") or 0))
    bench = dict(recipe.get("benchmark") or {})
    if isinstance(bench.get("concurrencies"), str):
        bench["concurrencies"] = [int(x) for x in bench["concurrencies"].split("x")]
    work = Path(tempfile.mkdtemp(prefix="srtctl_", dir=base))
    (work / "job.py").write_text(JOB)
    script = work / "sbatch_script.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --job-name={recipe.get('name', recipe_path.stem)}\n"
        f"#SBATCH --output={base}/%j/logs/sweep_%j.log\n"
        f"#SBATCH --time={(recipe.get('slurm') or {}).get('time_limit', '00:10:00')}\n"
        f"mkdir -p {base}/$SLURM_JOB_ID/logs\n"
        f"exec {sys.executable} {work}/job.py {base}/$SLURM_JOB_ID/job_config.json\n")
    # The job's output directory must exist before the job starts writing to it: hold it until ready.
    out = subprocess.run(["sbatch", "--hold", str(script)], capture_output=True, text=True)
    if out.returncode != 0:
        msg = {"status": "error", "error": out.stderr.strip()}
        print(json.dumps(msg) if args.json_output else f"sbatch failed: {out.stderr}")
        return 1
    job_id = out.stdout.strip().split()[-1]  # "Submitted batch job N", as srtctl parses it
    job_dir = base / job_id
    (job_dir / "logs").mkdir(parents=True, exist_ok=True)
    (job_dir / "config.yaml").write_text(recipe_path.read_text())
    (job_dir / "sbatch_script.sh").write_text(script.read_text())
    (job_dir / "job_config.json").write_text(json.dumps({"logs": str(job_dir / "logs"), "benchmark": bench,
                                                         "gpus": gpus}))
    (job_dir / f"{job_id}.json").write_text(json.dumps({"version": "2.0", "orchestrator": True, "job_id": job_id,
                                                         "job_name": recipe.get("name"), "benchmark": bench}))
    subprocess.run(["scontrol", "release", job_id], check=True, capture_output=True)
    record = {"status": "submitted", "slurm_job_id": job_id, "job_name": recipe.get("name"),
              "output_dir": str(job_dir), "metadata_path": str(job_dir / f"{job_id}.json"),
              "config_path": str(recipe_path), "tags": None}
    if args.json_output:
        print("Submitting: " + str(recipe.get("name")), file=sys.stderr)
        print(json.dumps(record))
    else:
        print(f"Job {job_id} submitted!\nLogs: {job_dir}/logs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
