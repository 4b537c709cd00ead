#!/usr/bin/env python3
"""A stand-in for srt-slurm's `srtctl` (which cannot be installed here), for tests and the dev-cpu
pipeline only.

It keeps srtctl's command line and output contract (srt-slurm src/srtctl/cli/submit.py):
  srtctl apply -f RECIPE [-o OUTPUT_BASE] [--json] [-y] [--tags T]
submits a REAL Slurm job with sbatch, creates OUTPUT_BASE/<job id>/ with config.yaml,
sbatch_script.sh, <job id>.json and logs/, prints one JSON line per submission with --json
({"status": "submitted", "slurm_job_id", "job_name", "output_dir", "metadata_path", "config_path",
"tags"}; errors: {"status": "error", "error"} and exit 1), else "Job <id> submitted!" /
"Logs: <dir>/logs".

The job is real, like srt-slurm's for an aggregated vLLM recipe: the batch script runs the recipe's
`model.container` (an image by digest) with docker on the node; inside, the recipe's
backend.vllm_config.aggregated flags start vLLM's OpenAI server on the model that `model.path`
names (a srtslurm.yaml `model_paths` alias, or a path in the image), then the benchmark runs:
  - sa-bench: one run of vLLM's serving benchmark per benchmark.concurrencies point, written
    (atomically) to logs/sa-bench_isl_<ISL>_osl_<OSL>/results_concurrency_<C>_gpus_<G>.json with
    vLLM's result keys; num_prompts = concurrency x STANDIN_PROMPTS_MULT (default 10; srt-slurm's
    sa-bench uses 10), at least STANDIN_MIN_PROMPTS (default 8);
  - gsm8k: benchmark.num_examples questions, 5-shot, written to logs/gsm8k_results.json like
    srt-slurm's gsm8k_eval.py --save-results ({accuracy, invalid_rate, latency, num_questions, ...}).
The benchmark clients are servestack's standard-library ones (src/servestack/clients), mounted
read-only: this stand-in measures for real, it only does not ship srt-slurm's own scripts.

Cluster config (srt-slurm's srtslurm.yaml, from $SRTSLURM_CONFIG or ./srtslurm.yaml, optional):
  model_paths: {alias: path in the image}   (built in: tiny-qwen3 -> the dev-cpu image's model)
  gsm8k_data: directory with test.jsonl and train.jsonl (default: ../shared/data/gsm8k)
  docker: docker command (default: docker)
  sbatch_args: extra sbatch options (default: [--exclusive])
  pycache_dir: host directory for the image's Python bytecode, kept per image digest (default:
      ~/.cache/srtctl-standin/pycache; the image ships none, and compiling torch + vLLM in every
      fresh container costs about a minute per job on 2 cores)
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
CLIENTS = HERE.parent / "src" / "servestack" / "clients"
DEFAULT_CLUSTER = {
    "model_paths": {"tiny-qwen3": "/opt/servestack/models/servestack/tiny-qwen3"},
    "gsm8k_data": str(HERE.parent.parent / "shared" / "data" / "gsm8k"),
    "docker": "docker",
    "sbatch_args": ["--exclusive"],
    "pycache_dir": str(Path.home() / ".cache" / "srtctl-standin" / "pycache"),
}
DIGEST_REF = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
PORT = 8000

# Runs inside the image, with the image's python (standard library only).
DRIVER = r'''
import json, os, signal, subprocess, sys, time, urllib.request
job = json.load(open("/job/job_config.json"))
logs = "/job/logs"
server = None

def log(msg):
    print(f"[srtctl-standin {time.strftime('%H:%M:%S')}] {msg}", flush=True)

def stop(*_):
    if server is not None and server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    sys.exit(143)

signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
env = dict(os.environ, **job["env"])
log("starting server: " + " ".join(job["server"]))
server = subprocess.Popen(job["server"], env=env, stdout=open(f"{logs}/agg_worker.log", "ab"),
                          stderr=subprocess.STDOUT, start_new_session=True)
deadline = time.monotonic() + job["startup_timeout"]
while True:
    if server.poll() is not None:
        log(f"server exited with {server.returncode}"); sys.exit(3)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{job['port']}/health", timeout=5) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    if time.monotonic() > deadline:
        log("server never became healthy"); stop()
    time.sleep(2)
log("server healthy")
b = job["benchmark"]
rc = 0
if b.get("type") == "gsm8k":
    tmp = f"{logs}/.gsm8k_client.json"
    t0 = time.monotonic()
    rc = subprocess.call(["python3", "/opt/srt-bench/gsm8k.py", "--base-url", f"http://127.0.0.1:{job['port']}",
                          "--model", job["served_model_name"], "--dataset", "/data/gsm8k/test.jsonl",
                          "--fewshot-from", "/data/gsm8k/train.jsonl", "--num-questions", str(b["num_examples"]),
                          "--shots", "5", "--repeats", "1", "--concurrency", str(b.get("concurrency", 8)),
                          "--max-tokens", str(b.get("max_tokens", 64)), "--out", tmp], env=env)
    if rc == 0:
        d = json.load(open(tmp))["repeats"][0]
        res = {"accuracy": d["accuracy_strict"], "accuracy_flexible": d["accuracy_flexible"],
               "invalid_rate": d["invalid_strict"] / d["n"], "latency": d["seconds"], "num_questions": d["n"],
               "num_shots": 5, "max_tokens": b.get("max_tokens", 64), "errors": d["errors"],
               "client_seconds": round(time.monotonic() - t0, 3)}
        with open(f"{logs}/.gsm8k_results.json.tmp", "w") as f:
            json.dump(res, f)
        os.replace(f"{logs}/.gsm8k_results.json.tmp", f"{logs}/gsm8k_results.json")
else:
    d = f"{logs}/sa-bench_isl_{b['isl']}_osl_{b['osl']}"
    os.makedirs(d, exist_ok=True)
    for c in b["concurrencies"]:
        name = f"results_concurrency_{c}_gpus_{job['gpus']}.json"
        n = max(job["min_prompts"], c * job["prompts_mult"])
        t0 = time.monotonic()
        r = subprocess.call(["python3", "/opt/srt-bench/vllm_bench_serve.py", "--backend", "vllm",
                             "--base-url", f"http://127.0.0.1:{job['port']}", "--endpoint", "/v1/completions",
                             "--model", job["model"], "--served-model-name", job["served_model_name"],
                             "--tokenizer", job["model"], "--dataset-name", "random",
                             "--random-input-len", str(b["isl"]), "--random-output-len", str(b["osl"]),
                             "--num-prompts", str(n), "--max-concurrency", str(c), "--request-rate", "inf",
                             "--ignore-eos", "--seed", "0", "--temperature", "0",
                             "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                             "--disable-tqdm", "--save-result", "--result-dir", d,
                             "--result-filename", f".{name}.tmp"], env=env)
        if r == 0 and os.path.exists(f"{d}/.{name}.tmp"):
            res = json.load(open(f"{d}/.{name}.tmp"))
            res["client_seconds"] = round(time.monotonic() - t0, 3)
            with open(f"{d}/.{name}.tmp", "w") as f:
                json.dump(res, f)
            os.replace(f"{d}/.{name}.tmp", f"{d}/{name}")
            log(f"concurrency {c}: done")
        else:
            log(f"concurrency {c}: failed (exit {r})")
            rc = 1
server.send_signal(signal.SIGTERM)
try:
    os.killpg(server.pid, signal.SIGTERM); server.wait(30)
except Exception:
    pass
sys.exit(rc)
'''


def cluster_config() -> dict:
    cfg = dict(DEFAULT_CLUSTER)
    path = os.environ.get("SRTSLURM_CONFIG") or ("srtslurm.yaml" if Path("srtslurm.yaml").is_file() else None)
    if path:
        user = yaml.safe_load(Path(path).read_text()) or {}
        cfg.update({k: v for k, v in user.items() if k != "model_paths"})
        cfg["model_paths"] = {**cfg["model_paths"], **(user.get("model_paths") or {})}
    return cfg


def flags_argv(flags: dict) -> list[str]:
    argv: list[str] = []
    for key, value in flags.items():
        flag = f"--{key}"
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            for v in value:
                argv += [flag, str(v)]
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv


def plan_job(recipe: dict, cfg: dict) -> dict:
    """What the job runs, from the recipe; raises ValueError with srtctl-like messages."""
    model = recipe.get("model") or {}
    image = str(model.get("container") or "")
    if not DIGEST_REF.match(image):
        raise ValueError(f"model.container {image!r} is not an image by digest (repo@sha256:<64 hex>)")
    alias = str(model.get("path") or "")
    path = cfg["model_paths"].get(alias, alias)
    if not path.startswith("/"):
        raise ValueError(f"model.path {alias!r} is neither a model_paths alias nor an absolute path")
    backend = recipe.get("backend") or {}
    if (backend.get("type") or "vllm") != "vllm" or backend.get("vllm_config", {}).get("aggregated") is None:
        raise ValueError("this stand-in runs aggregated vLLM recipes only (backend.vllm_config.aggregated)")
    flags = dict(backend["vllm_config"]["aggregated"])
    served = str(flags.pop("served-model-name", None) or recipe.get("name"))
    for reserved in ("model", "host", "port"):
        flags.pop(reserved, None)
    server = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", path, "--served-model-name", served,
              "--host", "127.0.0.1", "--port", str(PORT), *flags_argv(flags)]
    res = recipe.get("resources") or {}
    gpus = max(1, int(res.get("agg_nodes") or 1) * int(res.get("gpus_per_node") or 0))
    bench = dict(recipe.get("benchmark") or {})
    if bench.get("type") == "gsm8k":
        bench.setdefault("num_examples", 1319)
    else:
        c = bench.get("concurrencies")
        bench["concurrencies"] = ([int(x) for x in str(c).split("x")] if isinstance(c, (str, int))
                                  else [int(x) for x in c or []])
        if not bench["concurrencies"]:
            raise ValueError("benchmark.concurrencies is empty")
    return {"image": image, "server": server, "model": path, "served_model_name": served, "port": PORT,
            "env": {str(k): str(v) for k, v in (backend.get("aggregated_environment") or {}).items()},
            "benchmark": bench, "gpus": gpus, "startup_timeout": 900,
            "prompts_mult": int(os.environ.get("STANDIN_PROMPTS_MULT", "10")),
            "min_prompts": int(os.environ.get("STANDIN_MIN_PROMPTS", "8"))}


def batch_script(recipe: dict, base: Path, job: dict, cfg: dict, driver: Path) -> str:
    docker = cfg["docker"]
    time_limit = (recipe.get("slurm") or {}).get("time_limit", "00:30:00")
    pycache = Path(cfg["pycache_dir"]) / job["image"].rsplit("sha256:", 1)[-1][:16]
    run = [docker, "run", "--rm", "--name", "__NAME__", "--shm-size", "2g",
           "-e", "PYTHONPYCACHEPREFIX=/var/cache/pycache", "-e", "PYTHONDONTWRITEBYTECODE=",
           "-v", f"{pycache}:/var/cache/pycache",
           "-v", "__JOB__:/job", "-v", f"{driver}:/opt/srtctl-driver.py:ro",
           "-v", f"{CLIENTS}:/opt/srt-bench:ro", "-v", f"{Path(cfg['gsm8k_data']).resolve()}:/data/gsm8k:ro",
           job["image"], "python3", "/opt/srtctl-driver.py"]
    body = shlex.join(run).replace("__NAME__", '"srtctl-${SLURM_JOB_ID}"').replace("__JOB__", f"{base}/${{SLURM_JOB_ID}}")
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={recipe.get('name', 'srtctl')}",
             f"#SBATCH --output={base}/%j/logs/sweep_%j.log",
             f"#SBATCH --time={time_limit}",
             "#SBATCH --nodes=1",
             *[f"#SBATCH {a}" for a in cfg.get("sbatch_args") or []],
             "",
             f"mkdir -p {base}/$SLURM_JOB_ID/logs",
             f"trap '{docker} kill \"srtctl-${{SLURM_JOB_ID}}\" >/dev/null 2>&1; exit 143' TERM INT",
             f"{body} &",
             "wait $!"]
    return "\n".join(lines) + "\n"


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

    def fail(msg: str) -> int:
        print(json.dumps({"status": "error", "error": msg}) if args.json_output else f"Error: {msg}")
        return 1

    recipe_path = Path(args.config)
    recipe = yaml.safe_load(recipe_path.read_text()) or {}
    cfg = cluster_config()
    try:
        job = plan_job(recipe, cfg)
    except ValueError as exc:
        return fail(f"{recipe_path}: {exc}")
    base = (args.output_dir or Path("outputs")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="srtctl_", dir=base))
    driver = work / "driver.py"
    driver.write_text(DRIVER)
    script = work / "sbatch_script.sh"
    script.write_text(batch_script(recipe, base, job, cfg, driver))
    # The job's output directory must exist before the job starts writing to it: hold it until ready.
    out = subprocess.run(["sbatch", "--hold", str(script)], capture_output=True, text=True)
    if out.returncode != 0:
        return fail(f"sbatch failed: {out.stderr.strip()}")
    job_id = out.stdout.strip().split()[-1]  # "Submitted batch job N", as srtctl parses it
    job_dir = base / job_id
    (job_dir / "logs").mkdir(parents=True, exist_ok=True)
    (job_dir / "config.yaml").write_text(recipe_path.read_text())
    (job_dir / "sbatch_script.sh").write_text(script.read_text())
    (job_dir / "job_config.json").write_text(json.dumps(job, indent=2))
    (job_dir / f"{job_id}.json").write_text(json.dumps({
        "version": "2.0", "orchestrator": True, "job_id": job_id, "job_name": recipe.get("name"),
        "model": {"path": recipe.get("model", {}).get("path"), "container": job["image"]},
        "benchmark": job["benchmark"], "tags": args.tags}))
    subprocess.run(["scontrol", "release", job_id], check=True, capture_output=True)
    record = {"status": "submitted", "slurm_job_id": job_id, "job_name": recipe.get("name"),
              "output_dir": str(job_dir), "metadata_path": str(job_dir / f"{job_id}.json"),
              "config_path": str(recipe_path), "tags": args.tags}
    if args.json_output:
        print("Submitting: " + str(recipe.get("name")), file=sys.stderr)
        print(json.dumps(record))
    else:
        print(f"Job {job_id} submitted!\nLogs: {job_dir}/logs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
