"""Answer checks for the exercises of notebooks/02_pipeline_parallel.ipynb.

Each ``check_*`` compares a learner's number with the value of the schedule registry's theory
(:data:`pipeline.schedules.SCHEDULES`, whose ``bubble`` is :func:`pipeline.metrics.bubble_fraction` — not
assignment code) or of a closed formula, prints whether it is right and, if not, a hint, and returns True or
False. tests/pipeline/test_checks.py checks the formulas against the schedules they describe.
"""
from __future__ import annotations

from course.exercise_checks import report as _report

from pipeline.schedules import get_schedule


def forward_clock_cycles(micro_batches: int, n_stages: int) -> int:
    """Clock cycles of a GPipe forward pass of ``m`` micro-batches over ``n`` stages: ``m + n - 1``
    (Huang et al. 2019, Sec. 2.2, Fig. 2c)."""
    return micro_batches + n_stages - 1


def peak_in_flight_formula(schedule: str, rank: int, n_stages: int, micro_batches: int) -> int:
    """Micro-batches ``rank`` holds activations of at once: GPipe ``m``; 1F1B ``min(p - rank, m)``
    (Narayanan et al. 2021, Sec. 2.2.1)."""
    if schedule == "gpipe":
        return micro_batches
    if schedule == "1f1b":
        return min(n_stages - rank, micro_batches)
    raise ValueError(f"the formula covers 'gpipe' and '1f1b', got {schedule!r}")


def fewest_micro_batches(schedule: str, n_stages: int, max_bubble: float, virtual_stages: int = 1) -> int:
    """The smallest ``m`` whose theoretical bubble (:meth:`pipeline.schedules.Schedule.bubble`) is at most
    ``max_bubble``."""
    entry, m = get_schedule(schedule), 1
    while entry.bubble(n_stages, m, virtual_stages) > max_bubble + 1e-12:
        m += 1
    return m


# ---- the exercises -------------------------------------------------------------------------------

def check_bubbles(gpipe, interleaved, zb_h1) -> bool:
    """Exercise 1: p = 4 stages, m = 8 micro-batches, every action equally long. What bubble fraction does
    (a) GPipe, (b) interleaved 1F1B with v = 2 chunks per rank, (c) ZB-H1 have?"""
    ok = _report("GPipe bubble", gpipe, get_schedule("gpipe").bubble(4, 8),
                 "(p - 1) / (m + p - 1): p - 1 idle slots at each end of a step of m + p - 1 (Huang et al. 2019, Sec. 2.2)")
    ok &= _report("interleaved 1F1B bubble (v = 2)", interleaved, get_schedule("interleaved").bubble(4, 8, 2),
                  "each chunk is 1/v of a stage, so the fill and drain cost 1/v as much: (p - 1) / (v m + p - 1) "
                  "(Narayanan et al. 2021, Sec. 2.2.2)")
    ok &= _report("ZB-H1 bubble", zb_h1, get_schedule("zb-h1").bubble(4, 8),
                  "with F, B and W of equal time the deferred W's fill two thirds of 1F1B's bubble: "
                  "(p - 1) / (3 m + p - 1) (Qi et al. 2024, Sec. 2.1)")
    return bool(ok)


def check_clock_cycles(answer) -> bool:
    """Exercise 2: how many clock cycles does the forward pass of ``Pipe`` take with m = 12 micro-batches on
    n = 5 stages?"""
    return _report("clock cycles", answer, forward_clock_cycles(12, 5),
                   "micro-batch i is on stage j at cycle i + j; the last one (i = m - 1) reaches the last stage "
                   "(j = n - 1) at cycle m + n - 2, counting from 0")


def check_micro_batches_for_bubble(answer) -> bool:
    """Exercise 3: a 1F1B pipeline of p = 8 stages. What is the smallest number of micro-batches m that keeps
    the bubble fraction at or below 10 %?"""
    return _report("fewest micro-batches", answer, fewest_micro_batches("1f1b", 8, 0.10),
                   "solve (p - 1) / (m + p - 1) <= 0.1 for m and round up")


def check_activation_ratio(answer) -> bool:
    """Exercise 4: p = 4, m = 16, equal stages. How many times the activation memory of 1F1B does GPipe hold
    on rank 0 at its peak?"""
    return _report("GPipe / 1F1B activations on rank 0", answer,
                   peak_in_flight_formula("gpipe", 0, 4, 16) / peak_in_flight_formula("1f1b", 0, 4, 16),
                   "GPipe holds all m micro-batches when the backwards start; 1F1B's rank r holds at most p - r")


def dualpipev_bubble_units(n_devices: int, f: float = 1.0, b: float = 1.0, w: float = 1.0,
                           pair: float | None = None) -> float:
    """The idle time per device of DualPipeV on ``n_devices`` ranks (DeepSeek-V3 technical report, Sec. 3.2.1,
    Table 2; the DualPipe README's table for DualPipeV): ``(PP/2 - 1)(F&B + B - 3W)``, where *PP* is the number of
    **stages**, ``2 x n_devices``; ``B`` is the whole backward ``b + w`` (``b``: input gradient) and ``F&B`` the
    paired forward and backward (default ``f + b + w``: run one after the other, as this course's runner does).
    Exact (the largest idle time of any rank in the replay, tests/pipeline/test_dualpipe.py) when ``f = b = w``."""
    whole = b + w
    pair = f + whole if pair is None else pair
    return (n_devices - 1) * (pair + whole - 3 * w)


def one_f_one_b_bubble_units(n_devices: int, f: float = 1.0, whole_backward: float = 2.0) -> float:
    """1F1B's idle time per device on ``n_devices`` devices, one stage each: ``(PP - 1)(F + B)``."""
    return (n_devices - 1) * (f + whole_backward)


def check_dualpipev(bubble, one_f_one_b, activations) -> bool:
    """Exercise 6: GPT-2 cut into PP = 8 stages. DualPipeV runs them on 4 devices (two stages each), 1F1B on 8.
    With F, B (input gradient) and W of one unit each for a stage, the whole backward 2 and the pair F&B run as
    F + the whole backward (3): (a) how many units does each DualPipeV device idle, (b) each 1F1B device, and
    (c) how many stage-micro-batches of activations does a DualPipeV device hold at its peak?"""
    ok = _report("DualPipeV idle units per device", bubble, dualpipev_bubble_units(4),
                 "(PP/2 - 1)(F&B + B - 3W) with PP the number of stages (8), B the whole backward (2), F&B = 3")
    ok &= _report("1F1B idle units per device", one_f_one_b, one_f_one_b_bubble_units(8),
                  "(PP - 1)(F + B) on PP = 8 devices, B the whole backward (2)")
    ok &= _report("DualPipeV peak activations per device", activations, 2 * 4 + 1,
                  "PP + 1: the DualPipe README's table (stages, not devices); peak_in_flight of a rank's list")
    return bool(ok)


# ---- the worked problem at GPU scale (notebook 02, section 12) ------------------------------------------

GPT3_PIPELINE = dict(n_stages=8, layers=96, max_bubble=0.05)  # GPT-3 175B's 96 layers (Brown et al. 2020) on 8 stages


def interleaved_rank0_in_flight(n_stages: int, micro_batches: int, virtual_stages: int) -> int:
    """Rank 0's peak (chunk, micro-batch) pairs in flight under interleaved 1F1B (1F1B when ``virtual_stages`` is 1):
    its warm-up forwards, ``2 (p - 1) + (v - 1) p`` with v > 1 (Narayanan et al. 2021, Sec. 2.2.2; Megatron-LM's
    ``get_forward_backward_func``), ``p - 1`` with v = 1, plus the one forward of the first steady-state pair, and
    never more than the ``v m`` pairs there are. tests/pipeline/test_checks.py holds it against the action lists."""
    warmup = 2 * (n_stages - 1) + (virtual_stages - 1) * n_stages if virtual_stages > 1 else n_stages - 1
    return min(virtual_stages * micro_batches, warmup + 1)


def micro_batch_choice(n_stages: int, layers: int, max_bubble: float, virtual_stages: int) -> dict:
    """Choosing ``m`` for a ``layers``-layer model on ``n_stages`` stages: the fewest micro-batches, rounded up to a
    multiple of ``n_stages`` (interleaved 1F1B's rounds need it), whose theoretical bubble is at most ``max_bubble``
    — 1F1B with ``virtual_stages = 1``, interleaved 1F1B otherwise (Narayanan et al. 2021, Sec. 2.2) — and what it
    costs: rank 0's peak in-flight (chunk, micro-batch) pairs (:func:`interleaved_rank0_in_flight`), the same in units
    of a whole stage's activations (a chunk holds ``1 / v`` of a stage), and the stage boundaries a micro-batch
    crosses (``v`` times round the ranks).

    Returns ``{"m", "bubble", "in_flight_chunks", "in_flight_stages", "layers_per_chunk", "boundaries"}``.
    """
    name = "1f1b" if virtual_stages == 1 else "interleaved"
    m = fewest_micro_batches(name, n_stages, max_bubble, virtual_stages)
    m = -(-m // n_stages) * n_stages
    chunks = interleaved_rank0_in_flight(n_stages, m, virtual_stages)
    return {"m": m, "bubble": get_schedule(name).bubble(n_stages, m, virtual_stages), "in_flight_chunks": chunks,
            "in_flight_stages": chunks / virtual_stages, "layers_per_chunk": layers / (n_stages * virtual_stages),
            "boundaries": n_stages * virtual_stages - 1}


def check_gpt3_micro_batches(m_1f1b, m_interleaved, rank0_stages_1f1b, rank0_stages_interleaved) -> bool:
    """Exercise 9: GPT-3's 96 layers on 8 stages (:data:`GPT3_PIPELINE`), bubble at most 5 %: the fewest micro-batches
    (a multiple of 8) with 1F1B and with interleaved 1F1B at v = 2, and rank 0's peak activations in units of a whole
    stage's micro-batch for each (:func:`micro_batch_choice`)?"""
    one, two = (micro_batch_choice(**GPT3_PIPELINE, virtual_stages=v) for v in (1, 2))
    ok = [_report("m, 1F1B", m_1f1b, one["m"], "solve (p - 1) / (m + p - 1) <= 0.05, round up to a multiple of p"),
          _report("m, interleaved v = 2", m_interleaved, two["m"],
                  "solve (p - 1) / (v m + p - 1) <= 0.05, round up to a multiple of p"),
          _report("rank 0's activations, 1F1B (stage micro-batches)", rank0_stages_1f1b, one["in_flight_stages"],
                  "1F1B's rank 0 holds p micro-batches"),
          _report("rank 0's activations, interleaved (stage micro-batches)", rank0_stages_interleaved,
                  two["in_flight_stages"], "count rank 0's live (chunk, micro-batch) pairs at the peak of its action "
                                           "list (peak_in_flight) and divide by v: a chunk is half a stage")]
    return all(ok)


def check_backward_twice_forward(answer) -> bool:
    """Exercise 5: section 5's p = 4, m = 8 with every backward twice as long as a forward: the 1F1B bubble fraction?
    (Both the ramp and the step scale with ``t_F + t_B``: the fraction is still ``(p - 1) / (m + p - 1)``;
    tests/pipeline/test_checks.py holds it against a simulation of the action lists.)"""
    return _report("1F1B bubble with t_B = 2 t_F", answer, get_schedule("1f1b").bubble(4, 8),
                   "both the ramp and the step scale with t_F + t_B: the fraction is still (p - 1) / (m + p - 1)",
                   rel=1e-3)


def check_dualpipev_unequal(idle_units) -> bool:
    """Exercise 7: DualPipeV on p = 4 devices (PP = 8 stages) with F = 2, input gradient 1.5, W = 1 (the whole backward
    2.5, a pair run one after the other F&B = 4.5): the idle units per device by the DualPipe README's formula
    ``(PP/2 - 1)(F&B + B - 3W)``? (Whether the replay agrees is the open part.)"""
    return _report("DualPipeV's idle units by the formula", idle_units, dualpipev_bubble_units(4, f=2.0, b=1.5, w=1.0),
                   "(PP/2 - 1)(F&B + B - 3W) with PP = 8 stages, B the whole backward (2.5), F&B = 4.5", rel=1e-3)


def check_zbv_against_dualpipev(zbv_peak, dualpipev_peak) -> bool:
    """Exercise 8: ZB-V and DualPipeV on p = 4 devices (8 stages): the peak stage-micro-batches of activations per
    device of each (the DualPipe README's table: DualPipeV PP + 1; ZB-V holds 2p)?"""
    ok_z = _report("ZB-V's peak activations per device", zbv_peak, 2 * 4,
                   "ZB-V's warm-up fills the V: 2p stage-micro-batches on the first device", rel=0)
    ok_d = _report("DualPipeV's peak activations per device", dualpipev_peak, 2 * 4 + 1,
                   "PP + 1 with PP = 2p stages: one more than ZB-V, the price of its pairs", rel=0)
    return ok_z and ok_d
