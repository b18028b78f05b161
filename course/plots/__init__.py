"""Every plot of the course, in one place (notebooks call these; nothing here computes results).

* :mod:`course.plots.runs`          — throughput, loss curves, repeated timings (from results files)
* :mod:`course.plots.timelines`     — Gantt charts of pipeline schedules, bubble fraction, activation memory
* :mod:`course.plots.communication` — collectives and traffic per layer; the ring step by step, all-reduce
  bandwidth with alpha-beta fits and their residuals, bucket overlap timelines, compression trade-off
* :mod:`course.plots.memory`        — bytes per parameter per ZeRO stage and dp size, loss by precision, what fits
* :mod:`course.plots.mesh`          — the rank grid of a dp x pp x tp mesh, where each rank's step time goes
* :mod:`course.plots.context_parallel` — attention memory against sequence length, the ring's schedule, work and
  memory per rank, ring vs Ulysses communication
* :mod:`course.plots.moe`           — the all-to-all between ranks, tokens per expert, dropped choices by capacity,
  load balance over training
* :mod:`course.plots.parity`        — every parallel configuration's loss and gradient norm against one process
"""
from course.plots.communication import (plot_allreduce_bandwidth, plot_alpha_beta_fit, plot_comm_per_layer,
                                        plot_compression, plot_flight_records, plot_overlap_timeline, plot_ring_steps,
                                        plot_straggler)
from course.plots.context_parallel import (plot_attention_memory, plot_comm_volume, plot_memory_per_rank,
                                           plot_ring_schedule, plot_work_per_rank)
from course.plots.memory import plot_loss_by_precision, plot_memory_bars, plot_memory_timeline, plot_what_fits
from course.plots.mesh import plot_rank_grid, plot_time_breakdown
from course.plots.moe import plot_all_to_all, plot_balance_over_training, plot_dropped_fraction, plot_tokens_per_expert
from course.plots.parity import plot_parity
from course.plots.runs import (plot_grouped_bars, plot_loss_curves, plot_loss_difference,
                               plot_repeated_timings, plot_throughput)
from course.plots.timelines import (events_from_records, plot_activation_memory, plot_bubble, plot_gantt,
                                    plot_gantts)

__all__ = ["plot_comm_per_layer", "plot_ring_steps", "plot_allreduce_bandwidth", "plot_alpha_beta_fit", "plot_alpha_beta_fit",
           "plot_overlap_timeline", "plot_compression", "plot_flight_records", "plot_straggler", "plot_grouped_bars", "plot_loss_curves", "plot_loss_difference",
           "plot_repeated_timings", "plot_throughput",
           "events_from_records", "plot_activation_memory", "plot_bubble", "plot_gantt", "plot_gantts",
           "plot_memory_bars", "plot_memory_timeline", "plot_loss_by_precision", "plot_what_fits", "plot_rank_grid",
           "plot_time_breakdown",
           "plot_attention_memory", "plot_ring_schedule", "plot_work_per_rank", "plot_comm_volume",
           "plot_memory_per_rank", "plot_all_to_all", "plot_balance_over_training", "plot_tokens_per_expert",
           "plot_dropped_fraction",
           "plot_parity"]
