"""The ranked plans: every mesh of ``--n_devices`` the model and batch allow, each predicted, the fitting ones first."""
from __future__ import annotations

from dataclasses import dataclass

from course.config import ConfigError


@dataclass
class Plan:
    """One ranked plan: its mesh (``dims``: dp, pp, tp, cp, micro_batches), configuration and prediction."""

    dims: dict
    config: object
    prediction: object
    score: tuple


def plan_candidates(config) -> list[dict]:
    """Every mesh of ``config.n_devices`` the model and batch allow, as option values: each ``(dp, pp, tp)`` with
    ``dp * pp * tp * cp = n_devices`` (:func:`course.factorisations.factorisations`), ``--cp`` as given, the batch
    divisible by dp, and for each a micro-batch size of 1, 2, 4, ... rows dividing the per-dp batch
    (``micro_batches = batch / (dp rows)``; with pp > 1 at most 4 rows, since more micro-batches only shrink the
    bubble)."""
    from course.factorisations import factorisations

    model = config.model
    out = []
    for dp, pp, tp in factorisations(config.n_devices // config.cp, model.n_layer, model.n_head, model.n_inner):
        if config.batch_size % dp:
            continue
        per_dp, rows = config.batch_size // dp, 1
        while rows <= per_dp and (pp == 1 or rows <= 4):
            if per_dp % rows == 0:
                out.append({"dp": dp, "pp": pp, "tp": tp, "micro_batches": per_dp // rows})
            rows *= 2
    return out


def rank_plans(config, hardware) -> list[Plan]:
    """The plans for ``config.n_devices`` devices, best first: for each mesh of :func:`plan_candidates`, its fastest
    micro-batching that fits the device's memory (else its smallest in memory), predicted with
    :func:`project.planner.step.predict`; those that fit first, by predicted step time, then those that do not, by
    memory."""
    from project.planner.config import PlanConfig
    from project.planner.step import predict

    best: dict[tuple, Plan] = {}
    base = {k: v for k, v in config.record().items() if k not in ("dp", "pp", "tp", "micro_batches")}
    base.update(verify=False)
    for values in plan_candidates(config):
        try:
            plan = PlanConfig.for_test(**base, **values)
        except ConfigError:
            continue  # e.g. interleaved's micro-batch rule, or more stages than blocks x chunks
        out = predict(plan, hardware)
        key = (values["dp"], values["pp"], values["tp"])
        score = (not out.fits, out.step_s if out.fits else out.memory_bytes)
        if key not in best or score < best[key].score:
            best[key] = Plan(dict(values, cp=config.cp), plan, out, score)
    return sorted(best.values(), key=lambda p: p.score)


def format_plans(config, plans: list[Plan], top: int) -> str:
    """The ranked plans as a table: mesh, micro-batches, memory per device, step time, MFU, bubble, exposed
    communication and what limits each."""
    from project.planner.memory import RECOMPUTE_NAMES

    fitting = [p for p in plans if p.prediction.fits]
    head = (f"plans for {config.preset} on {config.n_devices} x {config.hardware}: batch {config.batch_size} x "
            f"{config.model_max_length} tokens, ZeRO-{config.zero}, {config.precision}, {config.schedule}, "
            f"recomputation: {RECOMPUTE_NAMES[config.recompute]}, {config.attention_kernel} attention, sequence "
            f"parallel {'on' if config.sequence_parallel else 'off'}, dp overlap {config.dp_overlap}; {len(plans)} meshes, "
            f"{len(fitting)} fit")
    lines = [head, "", f"{'#':>3} {'dp':>5} {'pp':>4} {'tp':>4} {'cp':>3} {'micro':>6} {'memory':>9} {'step':>10} "
             f"{'MFU':>6} {'bubble':>7} {'exposed comm':>13}  limited by"]
    for i, p in enumerate(plans[:top], 1):
        d, out = p.dims, p.prediction
        step = f"{out.step_s * 1e3:.1f} ms" if out.step_s < 1 else f"{out.step_s:.3f} s"
        lines.append(f"{i:>3} {d['dp']:>5} {d['pp']:>4} {d['tp']:>4} {d['cp']:>3} {d['micro_batches']:>6} "
                     f"{out.memory_bytes / 1e9:>6.1f} GB {step:>10} {out.mfu:>6.1%} {out.bubble:>7.1%} "
                     f"{out.comm_s / out.step_s:>13.1%}  {out.limit}")
    if not fitting:
        lines += ["", "no plan fits: try --zero 3, --activation_checkpointing, a smaller --batch_size or more devices"]
    return "\n".join(lines)
