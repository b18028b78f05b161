"""Measurements for notebooks/07_context_parallelism.ipynb (spawned processes cannot import cells).

Single process (no launch):

* :func:`online_softmax_example` — the running statistics of one query, block by block.
* :func:`attention_memory` — peak memory of one attention layer (forward + backward) against
  sequence length: the (seq x seq) matrix of plain attention, blockwise, PyTorch's kernel.
* :func:`blockwise_check` — blockwise attention against ``scaled_dot_product_attention``.

Workers (``course.launch.launch(worker, 4, ...)``):

* :func:`ring_report_worker` — ring attention's schedule and work per rank (zig-zag vs
  contiguous), the communication of ring and Ulysses counted against the formulas, their time.
* :func:`gpt2_memory_worker` — peak memory per rank of a GPT-2 training step against sequence
  length at cp = 1, 2, 4 (ring and Ulysses), and one step against a single process.
* :func:`cp_report_worker` — both of them in one launch (the notebook's).

Memory is measured with PyTorch's ``torch.distributed._tools.mem_tracker.MemTracker`` (it tracks
every tensor allocated while it is active, by category: activations, temporaries, parameters,
gradients, optimizer state) on CPU, and would read ``torch.cuda.max_memory_allocated`` on GPUs
just the same; peak = the largest total during the step. Times are wall-clock seconds with
warm-up, repeats, median and range, taken as the slowest rank of each repeat. Each function
returns plain Python values for the notebook to tabulate; the plots are in
:mod:`course.plots.context_parallel`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from context_parallel.blockwise_attention import blockwise_attention
from context_parallel.layouts import SequenceLayout
from context_parallel.online_softmax import SoftmaxState, finish, online_softmax_update
from context_parallel.ring_attention import ring_attention, ring_traffic_bytes
from context_parallel.ulysses import ulysses_attention, ulysses_traffic_bytes
from course.benchmarking import summarise

MB = 1e6


# ---- single process ---------------------------------------------------------------------------------------------


def online_softmax_example(scores: list[float], values: list[float], block: int = 2) -> dict:
    """One query over keys with the given ``scores`` (already ``scale q.k``) and one-number ``values``,
    folded in ``block`` keys at a time with :func:`context_parallel.online_softmax.online_softmax_update`.

    Returns ``{"steps": [{keys, block max, m, rescale of the old sums, l, acc, acc / l}], "online": (out, lse),
    "softmax": (out, lse)}`` where the last pair is computed at once from all the scores.
    """
    q = torch.ones(1, 1, 1, 1, dtype=torch.float64, device="cpu")
    k = torch.tensor(scores, dtype=torch.float64, device="cpu").view(1, 1, -1, 1)
    v = torch.tensor(values, dtype=torch.float64, device="cpu").view(1, 1, -1, 1)
    state = SoftmaxState.empty(q)
    steps = []
    for start in range(0, len(scores), block):
        old_m = float(state.m)
        state = online_softmax_update(state, q, k[..., start:start + block, :], v[..., start:start + block, :], 1.0)
        m = float(state.m)
        steps.append({"keys": f"{start}..{min(start + block, len(scores)) - 1}",
                      "scores": scores[start:start + block], "block max": max(scores[start:start + block]),
                      "m": m, "rescale exp(m_old - m)": float(torch.exp(torch.tensor(old_m - m, device="cpu"))),
                      "l": float(state.l), "acc": float(state.acc), "acc / l": float(state.acc / state.l)})
    out, lse = finish(state)
    s = torch.tensor(scores, dtype=torch.float64, device="cpu")
    return {"steps": steps, "online": (float(out), float(lse)),
            "softmax": (float(torch.softmax(s, 0) @ torch.tensor(values, dtype=torch.float64, device="cpu")),
                        float(torch.logsumexp(s, 0)))}


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention the plain way: the whole (seq x seq) score matrix, masked, softmax, times v."""
    scores = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v


def _peak(fn, device: torch.device | str = "cpu") -> dict:
    """Run ``fn()`` under MemTracker; the peak total on ``device`` and its parts (bytes), tensors made before
    not counted."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    with tracker:
        fn()
    snapshot = tracker.get_tracker_snapshot("peak")[torch.device(device)]
    parts = {str(kind).split(".")[-1]: int(n) for kind, n in snapshot.items()}
    return {"peak": parts.pop("Total"), **{k: v for k, v in parts.items() if v}}


def attention_memory(seq_lens: list[int], batch: int = 1, heads: int = 4, head_dim: int = 32,
                     block_size: int = 128) -> list[dict]:
    """Peak memory (MB) of one causal attention layer's forward and backward pass on q, k, v that exist
    already, per sequence length: ``eager`` (:func:`eager_attention`), ``blockwise``
    (:func:`context_parallel.blockwise_attention.blockwise_attention`) and ``sdpa`` (PyTorch's fused kernel),
    with the size of one (batch, heads, seq, seq) float32 score matrix beside them."""
    rows = []
    methods = {"eager": eager_attention,
               "blockwise": lambda q, k, v: blockwise_attention(q, k, v, causal=True, block_size=block_size),
               "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    for seq in seq_lens:
        g = torch.Generator().manual_seed(seq)
        q, k, v = (torch.randn(batch, heads, seq, head_dim, generator=g, device="cpu").requires_grad_(True)
                   for _ in range(3))
        for name, fn in methods.items():
            def step():
                fn(q, k, v).sum().backward()
            measured = _peak(step)
            q.grad = k.grad = v.grad = None
            rows.append({"seq": seq, "method": name, "peak MB": measured["peak"] / MB,
                         "activations MB": measured.get("ACT", 0) / MB, "temporaries MB": measured.get("TEMP", 0) / MB,
                         "one score matrix MB": batch * heads * seq * seq * 4 / MB})
    return rows


def blockwise_check(seq: int = 100, block_size: int = 32, batch: int = 2, heads: int = 4, head_dim: int = 16) -> dict:
    """Blockwise attention against ``scaled_dot_product_attention`` (causal), a block size that does not divide
    the sequence: the largest differences of the output and of the gradients, and the tiles computed."""
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(batch, heads, seq, head_dim, generator=g, device="cpu") for _ in range(4))
    results = {}
    for name, fn in (("sdpa", lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True)),
                     ("blockwise", lambda a, b, c: blockwise_attention(a, b, c, causal=True, block_size=block_size, stats=stats))):
        stats: dict = {}
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves)
        out.backward(grad)
        results[name] = (out.detach(), [t.grad for t in leaves], dict(stats))
    (ref, ref_grads, _), (out, grads, stats) = results["sdpa"], results["blockwise"]
    n = -(-seq // block_size)
    return {"max |out - sdpa|": float((out - ref).abs().max()),
            **{f"max |d{x} - sdpa|": float((a - b).abs().max()) for x, a, b in zip("qkv", grads, ref_grads)},
            "tiles computed": stats["forward_tiles"], "tiles without the causal skip": n * n}


# ---- ring and Ulysses across ranks ------------------------------------------------------------------------------


def _busiest_cpu_seconds(fn, group, repeats: int, warmup: int = 1) -> list[float]:
    """Per repeat, the CPU seconds ``fn()`` took on the busiest rank of ``group`` (:func:`course.measure.cpu_seconds`:
    this process's CPU time, which leaves out its waits for a core and for its peers): the time of ``fn`` replayed
    on a machine with a core per rank, where the busiest rank sets the pace and a message costs its CPU work (its
    copies and system calls), not its wire time. ``warmup`` untimed calls first."""
    import torch.distributed as dist

    from course.benchmarking import slowest
    from course.measure import cpu_seconds

    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        dist.barrier(group=group)
        start = cpu_seconds()
        fn()
        out.append(slowest(cpu_seconds() - start, group))
    return out


def _sent(counter) -> float:
    return float(sum(r.traffic_bytes for r in counter.records))


def ring_report_worker(rank: int, world_size: int, seq: int = 1024, heads: int = 4, head_dim: int = 32,
                       block_size: int = 64, repeats: int = 3) -> dict:
    """Ring attention and Ulysses on ``world_size`` ranks (4) and on pairs of them (cp = 2).

    Returns (every rank its own; the notebook reads rank 0's shared parts):

    * ``schedule``: ``{layout: [every rank's forward and backward steps]}`` at cp = world_size, causal: per
      step the home rank of the block computed (``src``), tiles, compute and wait spans (seconds since the
      first rank began the pass; the last repeat);
    * ``work``: ``{layout: {rank: {"forward_tiles", "backward_tiles", "compute_s", "compute_range_s"}}}`` with
      compute_s the median over ``repeats`` of the CPU seconds the rank computed in forward + backward (the
      work; the wall clock of a rank on shared cores also counts its waits for a core);
    * ``comm``: rows of bytes one rank sends per attention layer (counted with ``CommCounter``) and the
      formula, per method, cp and pass;
    * ``timing``: rows ``{"method", "cp", "busiest_cpu_s": [per repeat]}``: the forward + backward pass's cost on
      the busiest rank of the cp group, in CPU seconds (:func:`_busiest_cpu_seconds`) — what a replay on a core per
      rank takes, since the 4 ranks here share fewer cores and their wall clock would hold each other's turns;
    * ``max_diff``: largest |output - scaled_dot_product_attention| per method and cp;
    * ``torch``: what PyTorch's own context parallelism does here (:func:`torch_context_parallel`).
    """
    import torch.distributed as dist

    from course.collectives import CommCounter
    from course.launch import context
    from course.mesh import Mesh

    torch.set_num_threads(1)
    device = context().device
    # the cp groups of the meshes dp 2 x cp 2 (pairs [0, 1], [2, 3]) and cp = world_size (named "cp" by the mesh)
    groups = {cp: Mesh.build(dp=world_size // cp, cp=cp).cp_group for cp in (2, world_size)}
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(1, heads, seq, head_dim, generator=g).to(device) for _ in range(4))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out: dict = {"schedule": {}, "work": {}, "comm": [], "timing": [], "max_diff": {},
                 "shape": {"batch": 1, "heads": heads, "seq": seq, "head_dim": head_dim, "block_size": block_size}}

    def run(method, cp, layout, stats=None):
        group = groups[cp]
        r = dist.get_rank(group)
        lay = SequenceLayout(layout, cp, seq)
        leaves = [lay.shard(t, 2, r).clone().requires_grad_(True) for t in (q, k, v)]
        if method == "ring":
            o = ring_attention(*leaves, group=group, layout=lay, causal=True, block_size=block_size, stats=stats)
        else:
            o = ulysses_attention(*leaves, group=group, layout=lay, causal=True)
        o.backward(lay.shard(grad, 2, r))
        return float((o.detach() - lay.shard(ref, 2, r)).abs().max())

    cp = world_size
    for layout in ("contiguous", "zigzag"):
        computes, stats = [], {}
        for i in range(repeats + 1):
            stats = {}
            dist.barrier(group=dist.group.WORLD)
            run("ring", cp, layout, stats)
            if i:
                computes.append(stats["forward_cpu_seconds"] + stats["backward_cpu_seconds"])
        everyone: list = [None] * world_size
        mine = {"rank": rank, "forward": stats["forward"], "backward": stats["backward"],
                "forward_tiles": stats["forward_tiles"], "backward_tiles": stats["backward_tiles"],
                "compute_s": summarise(computes)["median"], "compute_range_s": (min(computes), max(computes))}
        dist.all_gather_object(everyone, mine, group=dist.group.WORLD)
        origin = {name: min(s["compute"][0] for e in everyone for s in e[name]) for name in ("forward", "backward")}

        def rel(steps, t0):  # seconds since the first rank began the pass (one clock: time.time())
            return [{"step": s["step"], "src": s["src"], "tiles": s["tiles"], "compute": [x - t0 for x in s["compute"]],
                     "wait": [x - t0 for x in s["wait"]]} for s in steps]

        out["schedule"][layout] = [{"rank": e["rank"], **{name: rel(e[name], origin[name]) for name in origin}}
                                   for e in everyone]
        out["work"][layout] = {e["rank"]: {k: e[k] for k in ("forward_tiles", "backward_tiles", "compute_s",
                                                             "compute_range_s")} for e in everyone}
    hidden = heads * head_dim
    formulas = {"ring": ring_traffic_bytes, "ulysses": ulysses_traffic_bytes}
    for p in (2, world_size):
        for method, layout in (("ring", "zigzag"), ("ulysses", "contiguous")):
            with CommCounter() as counter:
                group = groups[p]
                r = dist.get_rank(group)
                lay = SequenceLayout(layout, p, seq)
                leaves = [lay.shard(t, 2, r).clone().requires_grad_(True) for t in (q, k, v)]
                attend = ring_attention if method == "ring" else ulysses_attention
                o = attend(*leaves, group=group, layout=lay, causal=True, block_size=block_size)
                forward = _sent(counter)
                counter.reset()
                o.backward(lay.shard(grad, 2, r))
                backward = _sent(counter)
            out["max_diff"][f"{method} cp={p}"] = float((o.detach() - lay.shard(ref, 2, r)).abs().max())
            formula = formulas[method](1, seq, hidden, p)
            for phase, counted in (("forward", forward), ("backward", backward)):
                out["comm"].append({"method": method, "cp": p, "pass": phase, "counted MB": counted / MB,
                                    "formula MB": formula[phase] / MB})
            out["timing"].append({"method": method, "cp": p,
                                  "busiest_cpu_s": _busiest_cpu_seconds(lambda m=method, c=p, lay_=layout: run(m, c, lay_),
                                                                        groups[p], repeats)})
    g = torch.Generator().manual_seed(0)  # a fixed size, whatever ``seq``: the same comparison in every run
    out["torch"] = torch_context_parallel(*(torch.randn(1, heads, TORCH_CHECK_SEQ, head_dim, generator=g).to(device)
                                            for _ in range(3)), block_size)
    return out


TORCH_CHECK_SEQ = 1024  # tokens of the comparison with PyTorch's ring kernel


def torch_context_parallel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 64) -> dict:
    """PyTorch's context parallelism on this rank's device, over every rank (collective; whole q, k, v given).

    * ``public``: what ``torch.distributed.tensor.experimental.context_parallel`` does with causal
      ``scaled_dot_product_attention`` here: ``"ran"``, or the error it raises (on CPU it has no sharding rule
      for the CPU attention kernel: it handles the CUDA flash, efficient and cuDNN kernels only);
    * ``max |ours - torch's ring kernel|`` (CPU only): its ring kernel ``_templated_ring_attention`` (head-tail
      load balancing, i.e. the zig-zag layout) called with the CPU flash-attention op, against
      :func:`context_parallel.ring_attention.ring_attention` on the same zig-zag shards (forward): the largest
      difference over every rank's shard.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention

    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh(q.device.type, (world,), mesh_dim_names=("cp",))
    buffers = [t.clone() for t in (q, k, v)]
    try:
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(*buffers, is_causal=True)
        public = "ran"
    except Exception as exc:  # noqa: BLE001 - reported, it is the finding
        public = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    if q.device.type != "cpu":
        return {"public": public}
    layout = SequenceLayout("zigzag", world, q.size(2))
    shards = [layout.shard(t, 2, rank).contiguous() for t in (q, k, v)]
    theirs, *_ = _templated_ring_attention(mesh.get_group(), 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
                                           *shards, is_causal=True)
    ours = ring_attention(*shards, group=mesh.get_group(), layout=layout, causal=True, block_size=block_size)
    worst = (ours - theirs).abs().max().reshape(1).to(torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=mesh.get_group())  # the largest over every rank's shard
    return {"public": public, "max |ours - torch's ring kernel|": float(worst)}


# ---- GPT-2 ------------------------------------------------------------------------------------------------------


def _gpt2(seq: int, n_layer: int, vocab: int, n_embd: int = 128, n_head: int = 4):
    from context_parallel.gpt2 import use_context_parallel_attention
    from course.model import build_gpt2

    return use_context_parallel_attention(build_gpt2("tiny", vocab, n_positions=seq, dropout=0.0, seed=0,
                                                     n_layer=n_layer, n_embd=n_embd, n_head=n_head))


def _attention(method: str, cp: int, seq: int, group, block_size: int):
    """The ring with the zig-zag layout, or Ulysses with the contiguous one, over ``group``."""
    from context_parallel.gpt2 import ContextParallelAttention

    layout = SequenceLayout("zigzag" if method == "ring" else "contiguous", cp, seq)
    return ContextParallelAttention(method, layout, group, block_size)


def _batch(seq: int, vocab: int, batch: int = 1, device: torch.device | str = "cpu") -> dict:
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seq)).to(device)
    return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}


def gpt2_memory_worker(rank: int, world_size: int, seq_lens: list[int], cps: list[int], n_layer: int = 2,
                       vocab: int = 1000, block_size: int = 256) -> dict:
    """Peak memory of one training step (forward + backward) of a GPT-2 on one sequence, per rank, for
    each method (ring with the zig-zag layout, Ulysses), cp in ``cps`` (ranks 0 .. cp - 1 take part, the
    others wait) and sequence length; and one step's loss and gradients against a single process.

    Returns (rank 0; ``{}`` elsewhere) ``{"memory": [rows: method, cp, seq, peak MB (largest over the cp
    ranks), activations MB, temporaries MB, gradients MB (MemTracker's categories at that rank's peak moment,
    which can fall in the forward or the backward pass), saved for backward MB (the activation bytes autograd
    saved in the forward pass, :class:`course.saved_tensors.SavedTensorBytes`: all of them, whenever the peak
    falls), attention alone peak MB (one attention layer's forward + backward on the rank's shard: what differs
    between the methods)], "equality": [rows: method, cp, loss difference,
    largest gradient difference], "fixed": {sizes that do not depend on cp or seq: all weight gradients, one
    tile of scores}}``. Peak counts what the step allocates (not the weights, which exist
    before it); with cp = 1 both methods run the blockwise kernel on the whole sequence.
    """
    import torch.distributed as dist

    from context_parallel.gpt2 import shard_batch, shard_loss_sum
    from course.launch import context
    from course.mesh import Mesh
    from course.saved_tensors import SavedTensorBytes
    from course.task import worker_env_quiet

    worker_env_quiet()
    torch.set_num_threads(1)
    device = context().device
    # the cp group of the mesh dp (world_size / cp) x cp for every cp (every rank builds every mesh, in order)
    groups = {cp: Mesh.build(dp=world_size // cp, cp=cp).cp_group for cp in sorted(set(cps))}

    def setting(method, cp, seq):
        """Every rank meets here; a rank of the cp group gets ``(group, attention, a fresh model)``, the others None."""
        dist.barrier(group=dist.group.WORLD)
        if rank >= cp:
            return None
        return groups[cp], _attention(method, cp, seq, groups[cp], block_size), _gpt2(seq, n_layer, vocab).to(device)

    memory, equality = [], []
    for method in ("ring", "ulysses"):
        for cp in cps:
            for seq in seq_lens:
                found = setting(method, cp, seq)
                if found is None:
                    continue
                group, attention, model = found
                shard = shard_batch(_batch(seq, vocab, device=device), attention.layout, rank)

                params = list(model.parameters())

                def step():
                    with SavedTensorBytes(exclude=params) as saved:
                        loss, _ = shard_loss_sum(model, shard, attention)
                    measured_saved[0] = saved.activation_bytes
                    loss.backward()

                measured_saved = [0]
                measured = _peak(step, device)
                measured["saved"] = measured_saved[0]
                model.zero_grad(set_to_none=True)
                # the attention alone: one layer's forward + backward on this rank's shard, what differs between
                # the methods (the ring's tiles and travelling K/V, Ulysses' all-to-all copies and local kernel)
                heads, head_dim = model.config.n_head, model.config.n_embd // model.config.n_head
                g = torch.Generator().manual_seed(rank)
                q, k, v = (torch.randn(1, heads, seq // cp, head_dim, generator=g).to(device).requires_grad_()
                           for _ in range(3))
                measured["attention"] = _peak(lambda: attention(q, k, v, head_dim ** -0.5).sum().backward(), device)["peak"]
                peaks: list = [None] * cp
                dist.all_gather_object(peaks, measured, group=group)
                worst = max(peaks, key=lambda m: m["peak"])
                memory.append({"method": method, "cp": cp, "seq": seq, "peak MB": worst["peak"] / MB,
                               "activations MB": worst.get("ACT", 0) / MB, "temporaries MB": worst.get("TEMP", 0) / MB,
                               "gradients MB": worst.get("GRAD", 0) / MB,
                               "saved for backward MB": max(m["saved"] for m in peaks) / MB,
                               "attention alone peak MB": max(m["attention"] for m in peaks) / MB})
    dist.barrier(group=dist.group.WORLD)
    seq = seq_lens[0]
    batch = _batch(seq, vocab, batch=2, device=device)
    reference = _gpt2(seq, n_layer, vocab).to(device)
    loss, count = shard_loss_sum(reference, shard_batch(batch, SequenceLayout("contiguous", 1, seq), 0), None)
    (loss / count).backward()
    loss = loss.detach()
    for method in ("ring", "ulysses"):
        for cp in [c for c in cps if c > 1]:
            found = setting(method, cp, seq)
            if found is None:
                continue
            group, attention, model = found
            mine, _ = shard_loss_sum(model, shard_batch(batch, attention.layout, rank), attention)
            (mine / count).backward()
            total = mine.detach().clone()
            dist.all_reduce(total, group=group)
            grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(grads, group=group)  # the sum of the ranks' parts: the whole batch's gradient
            want = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
            equality.append({"method": method, "cp": cp, "loss": float(total / count),
                             "|loss - one process|": abs(float(total / count) - float(loss / count)),
                             "max |grad - one process|": float((grads - want).abs().max()),
                             "largest gradient": float(want.abs().max())})
    dist.barrier(group=dist.group.WORLD)
    fixed = {"weight gradients MB (whole model)": sum(p.numel() for p in reference.parameters()) * 4 / MB,
             "one tile of scores MB (block^2 x heads)": block_size ** 2 * reference.config.n_head * 4 / MB}
    return {"memory": memory, "equality": equality, "fixed": fixed} if rank == 0 else {}


def cp_report_worker(rank: int, world_size: int, ring_seq: int, seq_lens: list[int], cps: list[int],
                     repeats: int = 3) -> dict:
    """:func:`ring_report_worker` (on ``ring_seq`` tokens, ``repeats`` repeats) and then :func:`gpt2_memory_worker`
    (``seq_lens``, ``cps``) in one launch, so the notebook starts its 4 processes once. Returns ``{"ring": ...,
    "gpt2": ...}``, each as those workers return it on this rank."""
    ring = ring_report_worker(rank, world_size, ring_seq, repeats=repeats)
    return {"ring": ring, "gpt2": gpt2_memory_worker(rank, world_size, seq_lens, cps)}
