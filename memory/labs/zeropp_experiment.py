"""ZeRO++ measured beside ZeRO-3 and beside unsharded training (notebook 05; :mod:`memory.zeropp`).

:func:`zeropp_comparison_worker` trains a tiny GPT-2 on random tokens for a few AdamW steps three ways from the same
weights and batches — ZeRO-3 (:class:`memory.fsdp.FullyShardedModel`), ZeRO++ with the given parts
(:class:`memory.zeropp.ZeroPPModel`, hpZ's node-sized group from :meth:`course.mesh.Mesh.hybrid_shard_groups`) and one
unsharded replica stepping on the mean gradient of every rank's batch — and returns per step the losses, the bytes
each group carried (``course.collectives.CommCounter``), and the bytes of hpZ's secondary slices held after the
forward pass. :func:`quantization_errors` is the blockwise int8 round trip of every parameter tensor;
:func:`cross_node_bytes` the per-rank bytes of a step that cross nodes, ZeRO-3 against ZeRO++ (ring traffic).

Run: ``python -m memory.labs.zeropp_experiment`` (4 ranks, nodes of 2).
"""
from __future__ import annotations

import argparse

import torch

from course import benchmarking, collectives
from course.collectives import CommCounter
from course.loss import model_loss
from memory.labs.experiments import build_tiny_gpt2, random_batch
from memory.fsdp import FullyShardedModel
from memory.zeropp import ZeroPPModel, dequantize_blockwise, quantize_blockwise


def cross_node_bytes(psi: int, dp: int, node: int, block: int = 64, weight_bytes: int = 4,
                     grad_bytes: int = 4) -> dict[str, float]:
    """Bytes one rank sends per step over the links between nodes (ring traffic, ``Ψ = psi`` parameters, dp ranks
    in nodes of ``node``): ZeRO-3's forward and backward all-gathers and gradient reduce-scatter, all over dp; ZeRO++'s
    int8 forward all-gather and gradient all-to-all (a byte per element and ``4 / block`` for the scales), its
    backward all-gather inside the node (Wang et al. 2023, Sec. 3; module docstring of :mod:`memory.zeropp`)."""
    share = (dp - 1) / dp
    zero3 = share * psi * (2 * weight_bytes + grad_bytes)
    zeropp = share * psi * (1 + 4 / block) * 2 if dp > node else 0.0
    return {"zero3": zero3, "zeropp": zeropp, "ratio": zero3 / zeropp if zeropp else float("inf")}


def quantization_errors(model: torch.nn.Module, block: int = 64) -> list[dict]:
    """Per parameter tensor: its name, elements, the largest ``|w - dequantize(quantize(w))|`` over the bound
    ``scale / 2`` of its block (at most 1), and the relative RMS error ``||w - w_q|| / ||w||``."""
    rows = []
    for name, p in model.named_parameters():
        w = p.detach().reshape(-1).float()
        values, scales = quantize_blockwise(w, block)
        err = (w - dequantize_blockwise(values, scales, block)).abs()
        half_step = scales.repeat_interleave(block)[:w.numel()] / 2
        ratio = float((err / half_step.clamp_min(torch.finfo(torch.float32).tiny)).max())
        rows.append({"name": name, "numel": w.numel(), "max_err_over_half_step": ratio,
                     "relative_rms": float(err.norm() / w.norm().clamp_min(1e-30))})
    return rows


def zeropp_comparison_worker(rank: int, world_size: int, node: int, steps: int = 10, parts=("qwz", "hpz", "qgz"),
                             preset: str = "tiny", seq_len: int = 32, batch_size: int = 2, lr: float = 1e-3) -> dict:
    """Worker (``course.launch.launch``): see the module docstring. ``batch_size`` rows of ``seq_len`` random tokens
    per rank and step."""
    from course.mesh import Mesh

    mesh = Mesh.build(dp=world_size)
    node_group = mesh.hybrid_shard_groups(world_size // node)[0]
    plain, three, plus = (build_tiny_gpt2(preset, n_positions=seq_len) for _ in range(3))
    fsdp = FullyShardedModel(three, three.transformer.h, group=mesh.dp_group)
    zpp = ZeroPPModel(plus, plus.transformer.h, group=mesh.dp_group, options=parts, hpz_group=node_group)
    opts = {"plain": torch.optim.AdamW(plain.parameters(), lr=lr),
            "zero3": torch.optim.AdamW(fsdp.shard_parameters(), lr=lr),
            "zeropp": torch.optim.AdamW(zpp.shard_parameters(), lr=lr)}
    out = {"losses": {k: [] for k in opts}, "comm": {}, "secondary_bytes": 0,
           "numel": sum(p.numel() for p in {id(p): p for p in plain.parameters()}.values())}
    for step in range(steps):
        batches = [random_batch(step, batch_size, seq_len, 1000, r) for r in range(world_size)]
        mine = batches[rank]
        for o in opts.values():
            o.zero_grad(set_to_none=True)
        losses = [model_loss(plain, b) for b in batches]  # the unsharded replica: the mean over every rank's batch
        (sum(losses) / world_size).backward()
        opts["plain"].step()
        out["losses"]["plain"].append(float(sum(losses).detach()) / world_size)
        for name, sharded, model in (("zero3", fsdp, three), ("zeropp", zpp, plus)):
            counter = CommCounter()
            with counter:
                loss = model_loss(model, mine)
                if name == "zeropp":
                    out["secondary_bytes"] = zpp.held_secondary_bytes()
                loss.backward()
                sharded.finish_backward()
            opts[name].step()
            mean = collectives.all_reduce(loss.detach(), group=mesh.dp_group) / world_size
            out["losses"][name].append(float(mean))
            if step == 0:
                out["comm"][name] = counter.by_group()
    out["quantization"] = quantization_errors(plain) if rank == 0 else []
    return out


def main(argv=None) -> int:
    from course.launch import launch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    benchmarking.option(parser, "dp", default=4, note="gloo ranks")
    benchmarking.option(parser, "zeropp_group", default=2)
    benchmarking.steps_option(parser, 10)
    args = parser.parse_args(argv)
    if args.zeropp_group < 1 or args.dp % args.zeropp_group:
        parser.error(f"--zeropp_group {args.zeropp_group} must divide --dp {args.dp}")
    out = launch(zeropp_comparison_worker, args.dp, args.zeropp_group, args.steps, device="cpu", backend="gloo")[0]
    for name, groups in out["comm"].items():
        for group, kinds in groups.items():
            print(f"{name:>6} {group:>8}: " + ", ".join(f"{k} {v['count']:.0f} calls {v['bytes'] / 1e6:.3f} MB "
                                                          f"(ring {v['traffic_bytes'] / 1e6:.3f} MB)"
                                                          for k, v in kinds.items()))
    for step in range(args.steps):
        print(f"step {step}: " + "  ".join(f"{k} {v[step]:.4f}" for k, v in out["losses"].items()))
    print(f"hpZ secondary slices after the forward pass: {out['secondary_bytes'] / 1e6:.3f} MB per rank")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
