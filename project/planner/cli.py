"""The planner's command line: ``python -m project.planner``. Its options are declared here, once.

    python -m project.planner --preset gpt2-xl --hardware h100 --dp 8 --pp 4 --batch_size 512 --micro_batches 16 \\
        --model_max_length 1024 --vocab_size 50257 --zero 1
    python -m project.planner --preset llama3-8b --n_devices 1024 --hardware h100 --top 10   # the ranked plans
    python -m project.planner --preset tiny --hardware cpu --dp 2 --pp 2 --tp 2 --batch_size 16 --micro_batches 4 \\
        --model_max_length 64 --vocab_size 1000 --precision fp32 --measure       # prediction beside measurement

For a model (:data:`project.planner.model.MODELS`, or a free shape: ``--n_layer --n_embd --n_head --n_kv_head
--n_inner --mlp``), a mesh (``--dp --pp --tp --cp --ep``), micro-batches, schedule, ZeRO stage, recomputation,
attention kernel, precision and a device (``--hardware``: :data:`course.hardware.HARDWARE`, or this machine's CPU,
measured), it predicts per pipeline stage the memory one rank holds (:mod:`project.planner.memory`) and the step,
replayed kernel by kernel (:mod:`project.planner.step`), with MFU. Given ``--n_devices`` without ``--dp --pp --tp``
it ranks every mesh of that many devices (:mod:`project.planner.search`); ``--verify`` builds one fake rank of each
(:mod:`project.planner.verify`); ``--measure`` runs the configuration on this CPU (:mod:`project.planner.measure`).
Bad input ends with a message that says what to change (exit code 2).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from project.planner.config import PlanConfig


def load_hardware(config):
    """The :class:`course.hardware.Hardware` of ``config.hardware`` (the CPU: measured, or read from
    ``config.cpu_figures``)."""
    from course.hardware import HARDWARE

    if config.hardware != "cpu":
        return HARDWARE[config.hardware]
    from project.planner.communication import group_shape
    from project.planner.measure import cpu_hardware

    return cpu_hardware(config, [max(2, group_shape(config, g)[0]) for g in ("tp", "dp", "pp", "embedding")])


def main(argv=None) -> int:
    from course.results import write_json

    config = PlanConfig.from_command_line(argv, environment=False, prog="python -m project.planner")
    hardware = load_hardware(config)
    if config.ranking:
        from project.planner.search import format_plans, rank_plans

        plans = rank_plans(config, hardware)
        print(format_plans(config, plans, config.top))
        report = {"config": config.record(), "plans": [{"dims": p.dims, "prediction": dataclasses.asdict(p.prediction)}
                                                        for p in plans[:config.top]]}
        if config.verify:
            from project.planner.verify import verify_plans

            print("\nverify: one fake rank of each plan (project.planner.fake_mesh), its bytes beside the planner's")
            report["verify"] = verify_plans(plans[:config.top])
        if config.out:
            write_json(Path(config.out), report)
        return 0 if any(p.prediction.fits for p in plans) else 2
    from project.planner.report import fit_message, format_prediction
    from project.planner.step import predict

    prediction = predict(config, hardware)
    print(format_prediction(config, prediction))
    report = {"config": config.record(), "prediction": dataclasses.asdict(prediction)}
    status = 0
    if not prediction.fits:
        print(f"error: {fit_message(config, prediction)}", file=sys.stderr)
        status = 2
    elif config.measure:
        from project.planner.measure import compare, measure_run
        from project.planner.report import format_comparison

        measurement = measure_run(config)
        report["measurement"] = measurement
        report["errors"] = compare(config, prediction, measurement)
        print(format_comparison(report["errors"]))
    if config.out:
        write_json(Path(config.out), report)
    return status



