"""Accuracy and throughput stages: normalized results, gates, and the functions the CLI calls."""

from servestack.stages.execute import raise_for_verdict, run_pipeline, run_stage, stage_failed
from servestack.stages.gates import GateConfig, Verdict, evaluate_accuracy, evaluate_throughput, format_verdict
from servestack.stages.results import (
    AccuracyRun,
    StageResult,
    ThroughputPoint,
    parse_gsm8k_result,
    parse_srt_result,
    parse_vllm_result,
)

__all__ = [
    "AccuracyRun", "GateConfig", "StageResult", "ThroughputPoint", "Verdict",
    "evaluate_accuracy", "evaluate_throughput", "format_verdict", "parse_gsm8k_result", "parse_srt_result",
    "parse_vllm_result", "raise_for_verdict", "run_pipeline", "run_stage", "stage_failed",
]
