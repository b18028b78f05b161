"""The worker of tests/three_d/test_checkpoint_resharding.py: one launch of 8 ranks that trains at one layout
(writing checkpoints), then — in the same processes, with a new mesh, model and stage — resumes
from one of those checkpoints at another layout. Exactly what two runs of ``project/run_3d.py`` do
(``project.modes.train_worker`` with ``three_d.training.three_d_training``), but the data are prepared and the
libraries imported once (half the test's time)."""
from __future__ import annotations


def train_then_resume(rank: int, world_size: int, first, second) -> dict:
    """``run_epochs`` of ``first`` (layout and args), then of ``second`` (``second.resume`` set)."""
    from course.epoch_runner import run_epochs
    from course.launch import context
    from course.task import build_model, prepare_data, worker_env_quiet
    from three_d.rank_setup import setup_rank
    from three_d.training import ThreeDTraining

    worker_env_quiet()
    device = context().device
    data = prepare_data(first)
    written = {}
    for name, args in (("first", first), ("second", second)):
        ranked = setup_rank(args.dims, build_model(args, data.tokenizer.vocab_size), device)
        written[name] = run_epochs(ThreeDTraining(args, data, device, ranked))
    return written
