"""Workers of tests/course/test_rendezvous.py (spawned ranks import them by name)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def unsafe_order_worker(rank: int, world_size: int) -> float:
    """Both ranks isend, then recv: fine on plain gloo; then the same under NCCL's rules (a deadlock)."""
    from course import nccl_rules

    other = 1 - rank
    for rules in (False, True):
        if rules:
            nccl_rules.install()
        work = dist.isend(torch.full((4096,), float(rank)), other)
        buf = torch.empty(4096)
        dist.recv(buf, other)
        work.wait()
        if not rules:
            print(f"rank {rank}: plain gloo: exchanged {float(buf[0])}", flush=True)
    return float(buf[0])


def crossed_tags_worker(rank: int, world_size: int) -> None:
    """Rank 0 sends a 10-element message (tag 1) then a 20-element one (tag 2); rank 1 receives tag 2
    first. With tags this matches; NCCL matches by order, so the first send meets the 20-element receive."""
    if rank == 0:
        dist.send(torch.ones(10), 1, tag=1)
        dist.send(torch.ones(20), 1, tag=2)
    else:
        dist.recv(torch.empty(20), 0, tag=2)
        dist.recv(torch.empty(10), 0, tag=1)


def batched_exchange_worker(rank: int, world_size: int) -> float:
    from course.collectives import send_recv

    other = 1 - rank
    buf = send_recv(torch.full((4096,), float(rank)), other, torch.empty(4096), other)
    return float(buf[0])


def all_reduce_worker(rank: int, world_size: int, planted: str | None = None) -> list:
    """Ring and tree over the world (p = 4), ranks [0, 1, 2] (p = 3) and [0, 1] / [2, 3] (p = 2). ``planted``: with
    a planted wrong solution (:mod:`tests.support.planting`)."""
    from tests.support.planting import planting

    with planting(planted):
        return _all_reduce_cases(rank)


def _all_reduce_cases(rank: int) -> list:
    from communication.ring import ring_all_reduce, tree_all_reduce

    groups = {4: None, 3: dist.new_group([0, 1, 2]), 2: None}
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    groups[2] = pairs[rank // 2]
    out = []
    for p, group in groups.items():
        if p == 3 and rank == 3:
            continue
        for name, fn in (("ring", ring_all_reduce), ("tree", tree_all_reduce)):
            for n in (1, 7, 1001):
                x = torch.randint(-1000, 1000, (n,), generator=torch.Generator().manual_seed(17 * rank + n))
                want = x.clone()
                dist.all_reduce(want, group=group)
                got = fn(x.clone(), "sum", group)
                out.append((f"{name} p={p}", got, want))
    return out


def schedules_worker(rank: int, world_size: int, schedules: list, virtual_stages: int) -> list:
    """One tiny GPT-2 pipeline step per schedule (tests/support/pipeline.py's worker)."""
    from course.task import worker_env_quiet
    from tests.support.pipeline import gpt2_schedule_worker

    worker_env_quiet()
    torch.set_num_threads(1)
    return [gpt2_schedule_worker(rank, world_size, schedule, virtual_stages) for schedule in schedules]


def check_equal_to_single_process(results: dict, world_size: int, schedule: str) -> None:
    from tests.support.pipeline import check_equal_to_single_process as check

    try:
        check(results, world_size)
    except AssertionError as exc:
        raise AssertionError(f"{schedule}: {exc}") from None


# ---- making groups (course.nccl_rules, rule 5) ------------------------------------------------------------


def group_by_some_ranks_worker(rank: int, world_size: int) -> None:
    """Rank 0 makes ``new_group([0])``, rank 1 does not: plain gloo lets it (a non-member returns at once and the
    member's group needs no one else); then the same under NCCL's rules."""
    from course import nccl_rules

    for rules in (False, True):
        if rules:
            nccl_rules.install()
        if rank == 0:
            dist.new_group([0], group_desc="only rank 0")
            if not rules:
                print("rank 0: plain gloo: made a group rank 1 never made", flush=True)


def groups_in_different_orders_worker(rank: int, world_size: int) -> None:
    """Both ranks make ``new_group([0])`` and ``new_group([1])``, in opposite orders."""
    first, second = ([0], [1]) if rank == 0 else ([1], [0])
    dist.new_group(first)
    dist.new_group(second)


def meshes_and_checkpoint_group_worker(rank: int, world_size: int, shapes: list, planted: str | None = None) -> list:
    """Build a :class:`course.mesh.Mesh` of each ``(dp, pp, tp)`` in ``shapes`` in turn, then a group that leaves
    rank ``world_size - 1`` out (as the experiments' ``new_group(list(range(n)))`` do), then the async-checkpoint
    group; returns how many groups this rank holds after each mesh.

    ``planted``: a wrong way of making them — ``"embedding groups alone"`` (the middle stages gain no group while
    the ends gain their embedding group) or ``"local checkpoint group"`` (the checkpoint group made with
    ``use_local_synchronization=True``, named from the groups each rank holds)."""
    from torch.distributed import distributed_c10d as c10d

    import course.checkpoint
    import course.mesh
    from course.mesh import Mesh

    saved = course.mesh.Mesh._embedding_groups, course.checkpoint.checkpoint_group
    if planted == "embedding groups alone":
        def embedding_groups(self):
            mine = None
            for dp in range(self.dims.dp):
                for tp in range(self.dims.tp):
                    ranks = [self.dims.rank_of(0, dp, tp), self.dims.rank_of(self.dims.pp - 1, dp, tp)]
                    group = dist.new_group(ranks, group_desc="embedding")
                    mine = group if rank in ranks else mine
            return mine
        course.mesh.Mesh._embedding_groups = embedding_groups
    elif planted == "local checkpoint group":
        def checkpoint_group(group=None):
            return dist.new_group(list(range(world_size)), backend="gloo", use_local_synchronization=True,
                                  group_desc="checkpoint")
        course.checkpoint.checkpoint_group = checkpoint_group
    elif planted is not None:
        raise ValueError(f"unknown planted error {planted!r}")
    try:  # (a pooled rank runs other tests afterwards: the planted functions go back in any case)
        held = []
        for dp, pp, tp in shapes:
            Mesh.build(dp=dp, pp=pp, tp=tp)
            held.append(len(c10d._world.pg_names))
        dist.new_group(list(range(world_size - 1)), group_desc="all but the last rank")
        course.checkpoint.checkpoint_group(None)
    finally:
        course.mesh.Mesh._embedding_groups, course.checkpoint.checkpoint_group = saved
    return held


# ---- the run scripts and the shapes beyond the graded tests, under NCCL's rules (issue 38, item 9) ------------

SCRIPT_TIMEOUT = 240  # seconds: the launcher's wall-clock limit of one script run (--timeout); pytest's is above it
RULES_TIMEOUT = "60"  # seconds an emulated wait may last before it is called a deadlock (LLMSYS_NCCL_RULES_TIMEOUT)


def under_rules(monkeypatch) -> None:
    """The ranks of every launch from here on (pooled or fresh: they inherit the caller's environment) run with
    gloo held to NCCL's rules (:mod:`course.nccl_rules`, installed by :mod:`course.launch` in each rank)."""
    from course.nccl_rules import ENV, TIMEOUT_ENV

    monkeypatch.setenv(ENV, "1")
    monkeypatch.setenv(TIMEOUT_ENV, RULES_TIMEOUT)


def tiny_tokenizer(folder):
    """The tokenizer of :func:`tiny_run`'s runs (1000 tokens, trained on the first 2000 training pairs), trained into
    ``folder``; returns its file (copy it into a run's work directory and the run finds it cached)."""
    from course.data import load_translation_dataset
    from course.tokenizer import get_tokenizer, tokenizer_path

    corpus = load_translation_dataset("multi30k")
    corpus["train"] = corpus["train"].select(range(2000))
    get_tokenizer(corpus, folder, vocab_size=1000, train_examples=2000)
    return tokenizer_path(folder, "multi30k", 1000, "de", "en", 2000)


def tiny_run(workdir, *argv) -> list[str]:
    """A run script's command line for a short run: 2 optimizer steps of 8 sequences on the first 2000 training
    pairs (a tokenizer of 1000 tokens trained on them, cached in ``workdir``), one validation batch, 2 BLEU
    sentences, dropout 0 (runs of one preset then train the same model on the same batches). ``argv`` comes last
    and overrides any of these."""
    return ["--batch_size", "8", "--max_batches", "2", "--max_val_batches", "1", "--n_bleu", "2", "--dropout", "0",
            "--vocab_size", "1000", "--max_train_examples", "2000", "--workdir", str(workdir), "--quiet", "--overwrite",
            "--timeout", str(SCRIPT_TIMEOUT), *argv]


def run_script(main, workdir, prefix: str, world: int, *argv) -> list[dict]:
    """``main(tiny_run(workdir, *argv))`` of a ``project/run_*.py``; every rank's results of epoch 0, each checked:
    2 steps with finite losses, a finite validation loss.

    Raises:
        AssertionError: the run failed (with the tail of what it printed: the rank's error, e.g. a deadlock
            under NCCL's rules), or its results are missing or not finite.
    """
    import contextlib
    import io
    import json
    import math
    from pathlib import Path

    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        code = main(tiny_run(workdir, *argv))
    assert code == 0, f"{' '.join(argv)} failed under NCCL's rules:\n{printed.getvalue()[-8000:]}"
    results = [json.loads((Path(workdir) / f"{prefix}rank{r}_results_epoch0.json").read_text()) for r in range(world)]
    for rank, r in enumerate(results):
        assert r["steps"] == 2 and len(r["train_losses"]) == 2, f"{' '.join(argv)}: rank {rank} ran {r['steps']} steps"
        assert all(math.isfinite(x) for x in [*r["train_losses"], r["validation_loss"]]), \
            f"{' '.join(argv)}: rank {rank}: losses {r['train_losses']}, validation {r['validation_loss']}"
    return results


def schedule_cases_worker(rank: int, world_size: int, cases: list, n_layer: int, micro_sizes: list | None = None
                          ) -> list:
    """:func:`tests.support.pipeline.gpt2_schedule_worker` for each ``(schedule, chunks per rank)`` of ``cases``,
    on its tiny GPT-2 with ``n_layer`` blocks (interleaved at p = 3 with 2 chunks needs 6 virtual stages) and, if
    given, ``micro_sizes`` for its micro-batches (DualPipeV needs at least 2p of them)."""
    from course.task import worker_env_quiet
    from tests.support import pipeline

    worker_env_quiet()
    torch.set_num_threads(1)
    saved = pipeline.N_LAYER, pipeline.MICRO_SIZES
    pipeline.N_LAYER = n_layer  # a pooled rank runs other tests afterwards: put it back in any case
    pipeline.MICRO_SIZES = list(micro_sizes or pipeline.MICRO_SIZES)
    try:
        return [pipeline.gpt2_schedule_worker(rank, world_size, schedule, chunks) for schedule, chunks in cases]
    finally:
        pipeline.N_LAYER, pipeline.MICRO_SIZES = saved


# ---- collectives: the same sequence on every rank of a group (course.nccl_rules, rule 6) ----------------------

UNEVEN_SPLITS = {0: ([1, 3], [1, 2]), 1: ([2, 2], [3, 2])}  # rank: (input_split_sizes, output_split_sizes), rows


def planted_collectives_worker(rank: int, world_size: int) -> dict:
    """Collectives in a group of the two ranks (``group_desc="planted"``), each case after the one before; a case
    the rules refuse (:class:`course.nccl_rules.NcclRuleError`, raised on every rank before any rank issues the
    collective, so the ranks stay in step) gives its message, a case that runs its result:

    * ``"orders"``: rank 0 issues an all-reduce then an all-gather, rank 1 the two in the other order;
    * ``"splits"``: an all-to-all with uneven splits where rank 1 expects 2 rows from rank 0, which sends it 3
      (every rank's buffers hold the rows its own splits say: only the pair's agreement is wrong);
    * ``"uneven"``: the same all-to-all with splits that agree (rank i's input split j = rank j's output split i);
    * ``"dtypes"``: an all-reduce of 4 float32 on rank 0, of 4 float64 on rank 1;
    * ``"roots"``: a broadcast from rank 0 on rank 0, from rank 1 on rank 1;
    * ``"reduce_scatter"``: ``reduce_scatter_tensor`` keeping 2 elements on rank 0, 3 on rank 1;
    * ``"after"``: an all-reduce after all of them (the ranks are still in step)."""
    from course.nccl_rules import NcclRuleError

    group = dist.new_group([0, 1], group_desc="planted")
    out = {}

    def case(name, call):
        try:
            out[name] = call()
        except NcclRuleError as exc:
            out[name] = f"refused: {exc}"

    def all_reduce(x):
        dist.all_reduce(x, group=group)
        return x

    def orders():
        gathered = torch.empty(4)
        calls = [lambda: all_reduce(torch.ones(6)),
                 lambda: dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)), group=group)]
        for call in calls if rank == 0 else calls[::-1]:
            call()

    def all_to_all(output_splits):
        inputs, _ = UNEVEN_SPLITS[rank]
        x = torch.arange(4 * 2, dtype=torch.float32).view(4, 2) + 100 * rank
        received = torch.empty(sum(output_splits), 2)
        dist.all_to_all_single(received, x, output_splits, inputs, group=group)
        return received

    case("first", lambda: all_reduce(torch.ones(3)))  # the group's collective #1: "orders" is #2
    case("orders", orders)
    case("splits", lambda: all_to_all([1, 2] if rank == 0 else [2, 3]))
    case("uneven", lambda: all_to_all(UNEVEN_SPLITS[rank][1]))
    case("dtypes", lambda: all_reduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)))
    case("roots", lambda: dist.broadcast(torch.ones(2), src=rank, group=group))
    kept = 2 + rank
    case("reduce_scatter", lambda: dist.reduce_scatter_tensor(torch.empty(kept), torch.ones(2 * kept), group=group))
    case("after", lambda: all_reduce(torch.full((2,), float(rank + 1))))
    return out


def collective_of_one_rank_worker(rank: int, world_size: int) -> str | None:
    """Rank 0 issues an all-reduce in a group of both ranks that rank 1 never issues: rank 0 returns the rules'
    message (after ``LLMSYS_NCCL_RULES_TIMEOUT``), rank 1 None. Rank 1 stays in the group until rank 0 is done
    (a peer that left would end rank 0's wait with gloo's lost connection instead); the group goes when the run
    ends, and with it the signature rank 0 still waits for."""
    from torch.distributed import distributed_c10d as c10d

    from course.nccl_rules import NcclRuleError

    group = dist.new_group([0, 1], group_desc="planted")
    store, key = c10d._get_default_store(), "llmsys_test_collective_of_one_rank"
    if rank == 1:
        store.wait([key])
        store.delete_key(key)
        return None
    try:
        dist.all_reduce(torch.ones(5), group=group)
        return "ran"
    except NcclRuleError as exc:
        return str(exc)
    finally:
        store.set(key, "done")
