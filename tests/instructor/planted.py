"""Plausible wrong solutions of graded keys, planted to see the key's tests fail on them (instructor-only).

A graded test must fail on the stub and on every plausible wrong solution (docs/grading.md, "Wrong
solutions the tests reject"). The wrong solutions that once earned full marks are kept here, each
with the key, what is wrong, and the names it replaces (``"module:attribute"``, or
``"module:Class.attribute"``); :func:`plant` swaps them in for a block of code, in the process that
runs it — a test's own process, or a rank, through a worker's ``planted`` argument
(:mod:`tests.support.planting`). ``tests/instructor/test_planted.py`` runs each key's checks with each
of them and sees them fail. They stay out of the student release: several are the reference with one
line changed. :data:`ALTERNATIVES` holds correct solutions written otherwise than the reference, planted the
same way: the key's tests must pass on each (docs/grading.md, "Correct solutions the tests accept").
"""
from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import Any, Callable
from unittest import mock

import torch


@dataclass(frozen=True)
class Planted:
    key: str
    what: str
    targets: tuple[str, ...]
    make: Callable[[Any], Any]  # the original object -> its replacement


# ---- a5_7_3: Ulysses -------------------------------------------------------------------------------------------

def _ulysses_without_scale(original):
    def ulysses_attention(q, k, v, *, group=None, layout=None, causal, scale=None, block_size=64):
        return original(q, k, v, group=group, layout=layout, causal=causal, scale=None,  # scale never reaches
                        block_size=block_size)  # the local attention
    return ulysses_attention


# ---- a5_8_1: the router ----------------------------------------------------------------------------------------

def _route(probs_of):
    def make(original):
        from moe.router import Routing

        def route(logits, top_k, normalize_gates=True):
            probs = probs_of(logits)
            gates, experts = torch.topk(probs, top_k, dim=-1)
            if normalize_gates:
                gates = gates / gates.sum(dim=-1, keepdim=True)
            return Routing(logits, probs, gates, experts)
        return route
    return make


def _z_loss_in_the_logits_dtype(original):
    def router_z_loss(logits):
        return torch.logsumexp(logits, dim=-1).square().mean()  # bf16 logits: a bf16 z-loss
    return router_z_loss


def _unpermute_gates_token_major(original):
    def unpermute(y, source, gates, num_tokens):
        weights = gates.reshape(-1)[source].to(y.dtype)  # pair c * T + t read as t * k + c: another choice's gate
        return y.new_zeros(num_tokens, y.shape[1]).index_add(0, source % num_tokens, y * weights[:, None])
    return unpermute


def _counts_without_minlength(original):
    def permute(x, experts, kept, num_experts):
        out = original(x, experts, kept, num_experts)
        used = out.counts.nonzero()
        last = int(used.max()) + 1 if used.numel() else 0
        return out._replace(counts=out.counts[:last])  # bincount without minlength: trailing idle experts missing
    return permute


def _capacity_rounded_down(original):
    def expert_capacity(num_tokens, num_experts, top_k, capacity_factor):
        return None if capacity_factor is None else int(capacity_factor * num_tokens * top_k / num_experts)
    return expert_capacity


# ---- a5_8_2: expert parallelism --------------------------------------------------------------------------------
# Each calls all_to_all_single through its module at call time, so the tests' split-size check sees it.

def _counts_not_exchanged(original):
    def exchange_counts(counts, group):
        from course.collectives import group_size

        return counts.view(group_size(group), -1).clone()  # this rank's own counts taken for the received ones
    return exchange_counts


def _counts_transposed(original):
    def exchange_counts(counts, group):
        import moe.expert_parallel as ep_module
        from course.collectives import group_size

        ep = group_size(group)
        return ep_module.all_to_all_single(counts, group=group).view(-1, ep).t()  # read as [expert][rank]
    return exchange_counts


def _output_splits_from_local_counts(original):
    def dispatch(tokens, counts, group):
        import moe.expert_parallel as ep_module
        from moe.all_to_all import all_to_all

        ep = ep_module.group_size(group)
        received_counts = ep_module.exchange_counts(counts, group)
        local = received_counts.shape[1]
        input_splits = counts.view(ep, local).sum(dim=1).tolist()
        output_splits = list(input_splits)  # what this rank sends, taken for what it receives
        received = all_to_all(tokens, output_splits, input_splits, group)
        expert_of_row = torch.repeat_interleave(torch.arange(local, device=counts.device).repeat(ep),
                                                received_counts.reshape(-1))
        order = torch.argsort(expert_of_row, stable=True)
        return received[order], received_counts.sum(dim=0), ep_module.DispatchState(input_splits, output_splits, order)
    return dispatch


def _backward_splits_not_swapped(original):
    def backward(ctx, grad):
        import moe.all_to_all as a2a

        # the forward pass's splits again: the gradients are not sent back where their rows came from
        return a2a.all_to_all_single(grad.contiguous(), ctx.output_splits, ctx.input_splits, group=ctx.group), \
            None, None, None
    return staticmethod(backward)


def _rows_sent_in_float32(original):
    def dispatch(tokens, counts, group):
        return original(tokens.float(), counts, group)  # bf16 rows cast up: twice the bytes, float32 rows back
    return dispatch


def _counts_exchanged_in_the_world(original):
    def exchange_counts(counts, group):
        import moe.expert_parallel as ep_module
        from course.collectives import group_size

        return ep_module.all_to_all_single(counts).view(group_size(group), -1)  # every rank, not the ep group's
    return exchange_counts


def _even_splits(original):
    def all_to_all(x, output_splits, input_splits, group):
        import moe.all_to_all as a2a

        ep = len(input_splits)
        even = [x.shape[0] // ep] * ep  # each rank assumed to send and receive the same number of rows
        return a2a._AllToAll.apply(x, even, even, group)
    return all_to_all


# ---- a5_8_3: EP x DP gradients ---------------------------------------------------------------------------------

def _gradients_over_world_size(original):
    def sync_moe_gradients(model, dense_group, expert_group):
        import torch.distributed as dist

        from moe.gradients import _all_reduce_flat

        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        world = dist.get_world_size()  # the world, not the dp x cp group: wrong once pp or tp > 1
        _all_reduce_flat(model.dense_parameters(), dense_group, world)
        _all_reduce_flat(model.expert_parameters(), expert_group, world)
    return sync_moe_gradients


def _expert_gradients(group="edp", divisor="dp x cp"):
    """sync_moe_gradients with the experts' all-reduce in another ``group`` (``"dp"``: the dense group, where other
    experts' gradients are added) or divided by another ``divisor`` (``"edp"``: the replicas alone)."""
    def make(original):
        def sync_moe_gradients(model, dense_group, expert_group):
            from course.collectives import group_size
            from moe.gradients import _all_reduce_flat

            for p in model.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            ranks = group_size(dense_group)
            _all_reduce_flat(model.dense_parameters(), dense_group, ranks)
            _all_reduce_flat(model.expert_parameters(), dense_group if group == "dp" else expert_group,
                             group_size(expert_group) if divisor == "edp" else ranks)
        return sync_moe_gradients
    return make


# ---- a5_8_4: the DeepSeek-style layer -------------------------------------------------------------------------

def _deepseek_route(softmax=False, bias_in_gates=False, normalise_all=False, group_max=False, scale=True,
                    precision="float32", unbiased_gates=False):
    """The reference routing with one thing changed; ``precision``: the scores' sigmoid taken in float32, in the
    logits' own dtype (``"logits"``), or in it and then cast to float32 (``"cast"``); ``unbiased_gates``: the gates
    are the k largest unbiased scores, whichever experts the bias chose."""
    def make(original):
        from moe.router import Routing

        def deepseek_route(logits, bias, top_k, n_group=1, topk_group=1, routed_scaling_factor=1.0, normalize=True):
            if precision == "float32":
                scores = torch.softmax(logits.float(), -1) if softmax else torch.sigmoid(logits.float())
            else:
                scores = torch.sigmoid(logits)
                scores = scores.float() if precision == "cast" else scores
            choice = scores.detach() + bias.float()
            if n_group > 1:
                t, e = choice.shape
                grouped = choice.view(t, n_group, e // n_group)
                if group_max:
                    group_scores = grouped.amax(dim=-1)
                else:
                    group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)
                allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(
                    1, group_scores.topk(topk_group, dim=-1).indices, True)
                choice = choice.masked_fill(~allowed.repeat_interleave(e // n_group, dim=1), float("-inf"))
            experts = choice.topk(top_k, dim=-1).indices
            gated = scores + bias.float() if bias_in_gates else scores
            gates = gated.topk(top_k, dim=-1).values if unbiased_gates else gated.gather(1, experts)
            if normalize:
                gates = gates / (gated.sum(dim=-1, keepdim=True) if normalise_all else gates.sum(dim=-1, keepdim=True))
            if scale:
                gates = gates * routed_scaling_factor
            return Routing(logits, scores, gates, experts)
        return deepseek_route
    return make


def _bias_update_on_load_fractions(original):
    def updated_bias(bias, load, gamma):
        share = load.double() / load.sum()  # 0 / 0 with no load: NaN, and torch.sign(NaN) is 0 (no move)
        return bias.float() + gamma * torch.sign(share.mean() - share).float()
    return updated_bias


def _bias_update_proportional(original):
    def updated_bias(bias, load, gamma):
        load = load.to(torch.float32)
        return bias.float() + gamma * (load.mean() - load) / load.mean()  # moved by the relative imbalance
    return updated_bias


def _bias_update_sign_flipped(original):
    def updated_bias(bias, load, gamma):
        load = load.to(torch.float32)
        return bias.float() + gamma * torch.sign(load - load.mean())  # overloaded experts made more attractive
    return updated_bias


def _shared_experts_omitted(original):
    def add_shared_experts(routed, x, shared):
        return routed
    return add_shared_experts


# ---- a5_5_1: ZeRO-1 --------------------------------------------------------------------------------------------

def _zero1_slice_only(original):
    def _reduce_stage1(self):
        from course import collectives

        local = self._local_flat_grad()
        self.flat_grad = collectives.all_reduce(local.clone(), group=self.group) / self.dp
        self.shard.grad = self.flat_grad[self.start:self.end]  # every param.grad stays this rank's own
    return _reduce_stage1


def _shard_range_unpadded(original):
    def shard_range(numel, dp, dp_rank):
        size = -(-numel // dp)
        return dp_rank * size, min((dp_rank + 1) * size, numel), numel  # the last slice shorter, no padding
    return shard_range


def _in_the_world(original):
    """ZeRO's step (``_reduce_stage1``, ``_reduce_stage2``, ``ShardedUnit.reduce_gradients``; whichever ``original``
    is) with its collective over every rank instead of ``self.group``: the same on a run whose group is the world."""
    def _reduce_stage1(self):
        from course import collectives

        self.flat_grad = collectives.all_reduce(self._local_flat_grad()) / self.dp
        offset = 0
        for p, n in zip(self.params, self.numels):
            p.grad = self.flat_grad[offset:offset + n].view_as(p)
            offset += n
        self.shard.grad = self.flat_grad[self.start:self.end]

    def _reduce_stage2(self):
        from course import collectives

        local = self._local_flat_grad()
        for p in self.params:
            p.grad = None
        self.shard.grad = collectives.reduce_scatter(local, 0) / self.dp

    @torch.no_grad()
    def reduce_gradients(self):
        from course import collectives
        from memory.zero import flatten_into

        local = flatten_into([(p.grad, n) for p, n in zip(self.params, self.numels)], self.padded, self.shard.device)
        for p in self.params:
            p.grad = None
        grad = collectives.reduce_scatter(local, 0) / self.dp
        self.shard.grad = grad if self.shard.grad is None else self.shard.grad + grad
        self.ready = 0

    return {f.__name__: f for f in (_reduce_stage1, _reduce_stage2, reduce_gradients)}[original.__name__]


def _zero1_grads_at_the_start(original):
    def _reduce_stage1(self):
        from course import collectives

        self.flat_grad = collectives.all_reduce(self._local_flat_grad(), group=self.group) / self.dp
        for p, n in zip(self.params, self.numels):
            p.grad = self.flat_grad[:n].view_as(p)  # the offset never advances: every grad from the buffer's start
        self.shard.grad = self.flat_grad[self.start:self.end]
    return _reduce_stage1


# ---- a5_5_4: activation checkpointing --------------------------------------------------------------------------

def _checkpoint_function(save_gpu: bool, fork_gpu: bool, restore_cpu: bool = True):
    """A CheckpointFunction that restores the CPU's random state (inside fork_rng; not with ``restore_cpu``
    False) and, with ``save_gpu``, the inputs' GPUs' — inside fork_rng only with ``fork_gpu``. It replays no
    autocast state: the recomputation runs in whatever precision the backward pass runs in."""
    def make(original):
        class CheckpointFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, run, *inputs):
                ctx.run = run
                ctx.cpu_rng = torch.get_rng_state()
                ctx.gpus = sorted({x.device.index for x in inputs if torch.is_tensor(x) and x.device.type == "cuda"})
                ctx.gpu_rng = [torch.cuda.get_rng_state(g) for g in ctx.gpus] if save_gpu else []
                ctx.save_for_backward(*inputs)
                with torch.no_grad():
                    return run(*inputs)

            @staticmethod
            def backward(ctx, *grad_outputs):
                inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
                with torch.random.fork_rng(devices=ctx.gpus if fork_gpu else []):
                    if restore_cpu:
                        torch.set_rng_state(ctx.cpu_rng)
                    for gpu, state in zip(ctx.gpus, ctx.gpu_rng):
                        torch.cuda.set_rng_state(state, gpu)
                    with torch.enable_grad():
                        outputs = ctx.run(*inputs)
                outputs = outputs if isinstance(outputs, tuple) else (outputs,)
                pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad and g is not None]
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
                return (None, *[x.grad if x.requires_grad else None for x in inputs])
        return CheckpointFunction
    return make


# ---- a5_5_5: ZeRO++ ---------------------------------------------------------------------------------------------

def _quantize(scale_of, round_=torch.round):
    """A blockwise quantizer with another scale (``scale_of(blocks [nb, block]) -> [nb]``) or rounding."""
    def make(original):
        def quantize_blockwise(x, block):
            n = x.numel()
            nblocks = -(-n // block)
            blocks = torch.zeros(nblocks * block)
            blocks[:n] = x.detach().float()
            blocks = blocks.view(nblocks, block)
            scales = scale_of(blocks)
            divisor = torch.where(scales > 0, scales, torch.ones_like(scales))
            values = round_(blocks / divisor[:, None]).clamp(-127, 127).to(torch.int8)
            return values.view(-1)[:n], scales
        return quantize_blockwise
    return make


def _gathered_without_dequantizing(original):
    def quantized_all_gather(shard, block, group=None):
        import memory.zeropp as zpp

        values, _ = zpp.quantize_blockwise(shard, block)
        return zpp.collectives.all_gather(values, 0, group=group).float()  # the int8 levels taken as the weights
    return quantized_all_gather


def _backward_gather_in_the_dp_group(original):
    @torch.no_grad()
    def gather(self, backward=False):
        import memory.zeropp as zpp

        if self.gathered:
            return
        self.full.untyped_storage().resize_(self.full_bytes)
        if self.qwz and not backward and not self.exact:
            self.full.copy_(zpp.quantized_all_gather(self.shard.detach(), self.block, group=self.group))
        else:  # backward: ZeRO-3's all-gather over every dp rank, the secondary slices unused
            self.full.copy_(zpp.collectives.all_gather(self.shard.detach(), 0, group=self.group))
        self.gathered = True
    return gather


def _gathered_dequantized(original):
    def quantized_all_gather(shard, block, group=None):
        import memory.zeropp as zpp

        values, scales = zpp.quantize_blockwise(shard, block)
        local = zpp.dequantize_blockwise(values, scales, block)  # the same numbers, sent as fp32: 4 bytes each
        return zpp.collectives.all_gather(local, 0, group=group)
    return quantized_all_gather


def _secondary_slice_by_dp_rank(original):
    def post_forward(self, module, args, output):
        import memory.zeropp as zpp

        if self.hpz_group is not None and torch.is_grad_enabled() and not self.is_root:
            r = zpp.collectives.group_rank(self.group)  # the rank in the dp group, not in the node-sized group
            size = self.padded // self.g
            self.secondary = self.full[r * size:(r + 1) * size].clone()
        return zpp.ShardedUnit.post_forward(self, module, args, output)
    return post_forward


def _dequantized_in_whole_blocks(original):
    def dequantize_blockwise(values, scales, block):
        return values.float() * scales.repeat_interleave(block)  # a short last block not cut
    return dequantize_blockwise


def _qgz(combine):
    """qgZ's reduce-scatter exchanging what the reference exchanges (each chunk's int8 values, then its scales, by
    all-to-all) and then ``combine(values [p, L] int8, scales as received [p * blocks], p, block)``."""
    def make(original):
        def quantized_reduce_scatter(x, block, group=None):
            import memory.zeropp as zpp

            p = zpp.collectives.group_size(group)
            if p == 1:
                return x.clone()
            quantized = [zpp.quantize_blockwise(c, block) for c in x.view(p, -1)]
            values = zpp.collectives.all_to_all_single(torch.cat([v for v, _ in quantized]), group=group).view(p, -1)
            scales = zpp.collectives.all_to_all_single(torch.cat([s for _, s in quantized]), group=group)
            return combine(values, scales, p, block)
        return quantized_reduce_scatter
    return make


def _levels_summed(values, scales, p, block):
    from memory.zeropp import dequantize_blockwise

    # the int8 levels of the ranks summed as they are, then scaled once (by the ranks' mean scale)
    summed = values.sum(dim=0).clamp(-127, 127).to(torch.int8)
    return dequantize_blockwise(summed, scales.view(p, -1).mean(dim=0), block) * p


def _scales_transposed(values, scales, p, block):
    from memory.zeropp import dequantize_blockwise

    scales = scales.view(-1, p).t()  # [block][rank] read as [rank][block]: chunks with another's scales
    return sum(dequantize_blockwise(v, s.contiguous(), block) for v, s in zip(values, scales))


def _one_message(original):
    """qwZ's all-gather or qgZ's all-to-all (whichever ``original`` is) sending each block's int8 values and its
    fp32 scales' bytes in one message instead of two: the same bytes, one call fewer."""
    def quantized_all_gather(shard, block, group=None):
        import memory.zeropp as zpp

        p = zpp.collectives.group_size(group)
        values, scales = zpp.quantize_blockwise(shard, block)
        n = values.numel()
        gathered = zpp.collectives.all_gather(torch.cat([values, scales.view(torch.int8)]), 0, group=group)
        return torch.cat([zpp.dequantize_blockwise(m[:n], m[n:].clone().view(torch.float32), block)
                          for m in gathered.view(p, -1)])

    def quantized_reduce_scatter(x, block, group=None):
        import memory.zeropp as zpp

        p = zpp.collectives.group_size(group)
        if p == 1:
            return x.clone()
        messages = [torch.cat([v, s.view(torch.int8)]) for v, s in
                    (zpp.quantize_blockwise(c, block) for c in x.view(p, -1))]
        n = x.numel() // p
        received = zpp.collectives.all_to_all_single(torch.cat(messages), group=group).view(p, -1)
        return sum(zpp.dequantize_blockwise(m[:n], m[n:].clone().view(torch.float32), block) for m in received)

    return {"quantized_all_gather": quantized_all_gather,
            "quantized_reduce_scatter": quantized_reduce_scatter}[original.__name__]


# ---- a5_2_7: the V-shaped schedules ----------------------------------------------------------------------------
# Each is the reference's list changed in one place (or another schedule's list): what a plausible wrong
# generator writes.

def _v_on_the_interleaved_placement(original):
    def actions(rank, n_stages, micro_batches):
        from pipeline.schedules import interleaved_1f1b_actions

        return interleaved_1f1b_actions(rank, n_stages, micro_batches, 2)  # chunk c read as stage c * p + rank
    return actions


def _w_before_its_b(original):
    def actions(rank, n_stages, micro_batches):
        out = list(original(rank, n_stages, micro_batches))
        for n, action in enumerate(out):
            if action[0] == "B" and ("W",) + action[1:] in out:
                out.remove(("W",) + action[1:])
                out.insert(n, ("W",) + action[1:])  # the first split backward's W moved before it
                break
        return out
    return actions


def _pairs_unpaired(original):
    def actions(rank, n_stages, micro_batches):
        from pipeline.schedules import flatten_pairs

        return flatten_pairs(original(rank, n_stages, micro_batches))  # same order, no F&B pairs
    return actions


def _warm_up_one_longer(original):
    def actions(rank, n_stages, micro_batches):
        out = list(original(rank, n_stages, micro_batches))
        first_f1 = next(n for n, a in enumerate(out) if a[0] == "F" and a[2] == 1)
        later_f0 = next((n for n, a in enumerate(out) if n > first_f1 and a[0] == "F" and a[2] == 0), None)
        if later_f0 is not None:
            out.insert(first_f1, out.pop(later_f0))  # one more chunk-0 forward before the first chunk-1 forward
        return out
    return actions


def _zb_h1_on_each_chunk(original):
    def actions(rank, n_stages, micro_batches):
        from pipeline.schedules import zb_h1_actions

        one = zb_h1_actions(rank, n_stages, micro_batches)
        return [(k, i, 0) for k, i in one] + [(k, i, 1) for k, i in one]  # ZB-H1's order reused, chunk after chunk
    return actions


# ---- a5_4_4: the first divergence of a hung run -----------------------------------------------------------------

def _divergences(align="seq", pick="first", p2p="pairs", members="group", compare="signature", walk="both",
                 message="sizes_dtypes", undumped="skip"):
    """An analysis of flight-recorder records with one thing wrong: records lined up by their place in each rank's
    list of the group (``align="position"``) or by seq across every group (``"ignore_group"``); the last divergence
    of a group (``pick="last"``); sends and receives lined up by ``p2p_seq_id`` like collectives (``p2p="seq"``);
    every rank counted as a member of every group (``members="all"``); collectives compared by name only
    (``compare="op"``) or by a hand-written ``(op, sizes, dtypes)`` instead of ``Record.signature``
    (``compare="fields"``); only the receives walked, each looking for its send (``walk="receives"``); messages
    compared by their sizes only (``message="sizes"``); a pair judged when one of its ranks left no dump
    (``undumped="judge"``)."""
    def make(original):
        from communication.hang_lab import Divergence

        def first_divergences(records):
            found, groups, lists = [], {}, {}
            for rank, recs in records.items():
                for rec in recs:
                    groups.setdefault(rec.group, rec)
                    if rec.is_p2p and p2p == "pairs":
                        continue
                    key = "all" if align == "ignore_group" else (rec.group, rec.is_p2p)
                    lists.setdefault(key, {}).setdefault(rank, []).append(rec)
            for key, by_rank in lists.items():
                first = next(iter(by_rank.values()))[0]
                ranks = (sorted(records) if members == "all" or align == "ignore_group"
                         else [m for m in first.group_ranks if m in records])
                keyed = {m: (dict(enumerate(by_rank.get(m, []))) if align == "position"
                             else {r.seq: r for r in by_rank.get(m, [])}) for m in ranks}
                start = max(min(keyed[m]) for m in ranks if keyed[m])  # older records may have left a buffer
                hits = []
                for s in sorted({s for m in ranks for s in keyed[m] if s >= start}):
                    posted = {m: keyed[m].get(s) for m in ranks}
                    names = {(r.op if compare == "op" else (r.op, r.sizes, r.dtypes) if compare == "fields"
                              else r.signature) for r in posted.values() if r is not None}
                    if None in posted.values() or len(names) > 1:
                        seq = next(r.seq for r in posted.values() if r is not None)
                        hits.append(Divergence(first.group, first.group_desc, seq, posted))
                if hits:
                    found.append(hits[0] if pick == "first" else hits[-1])
            if p2p == "pairs":
                messages = {}
                for rank, recs in records.items():
                    for rec in recs:
                        if rec.is_p2p:
                            k = (rec.group, rank, rec.peer) if rec.op == "send" else (rec.group, rec.peer, rank)
                            messages.setdefault(k, ([], []))[0 if rec.op == "send" else 1].append(rec)
                fields = (lambda r: r.sizes) if message == "sizes" else (lambda r: (r.sizes, r.dtypes))
                for (group, src, dst), (sends, recvs) in messages.items():
                    if undumped == "skip" and (src not in records or dst not in records):
                        continue
                    for k in range(len(recvs) if walk == "receives" else max(len(sends), len(recvs))):
                        a = sends[k] if k < len(sends) else None
                        b = recvs[k] if k < len(recvs) else None
                        if a is None or b is None or fields(a) != fields(b):
                            found.append(Divergence(group, groups[group].group_desc, k + 1, {src: a, dst: b},
                                                    (src, dst)))
                            break
            return found
        return first_divergences
    return make


def _divergences_by_queues(original):
    """A correct analysis written another way: each group's collectives walked seq by seq from the newest of its
    members' oldest records, and each pair's sends and receives in two queues popped together."""
    from collections import deque

    from communication.hang_lab import Divergence

    def first_divergences(records):
        groups, collectives, queues = {}, {}, {}
        for rank in sorted(records):
            for rec in records[rank]:
                groups.setdefault(rec.group, rec)
                if not rec.is_p2p:
                    collectives.setdefault(rec.group, {}).setdefault(rank, {})[rec.seq] = rec
                    continue
                src, dst = (rank, rec.peer) if rec.op == "send" else (rec.peer, rank)
                if src in records and dst in records:  # a rank without a dump: nothing to judge against
                    queues.setdefault((rec.group, src, dst), {"send": deque(), "recv": deque()})[rec.op].append(rec)
        found = []
        for group, by_rank in collectives.items():
            kept = {m: by_rank[m] for m in groups[group].group_ranks if m in records and by_rank.get(m)}
            members = [m for m in groups[group].group_ranks if m in records]
            seq, last = max(min(s) for s in kept.values()), max(max(s) for s in kept.values())
            while seq <= last:
                posted = {m: by_rank.get(m, {}).get(seq) for m in members}
                present = [rec for rec in posted.values() if rec is not None]
                if len(present) < len(posted) or any(r.signature != present[0].signature for r in present):
                    found.append(Divergence(group, groups[group].group_desc, seq, posted))
                    break
                seq += 1
        for (group, src, dst), queue in queues.items():
            k = 0
            while queue["send"] or queue["recv"]:
                k += 1
                send = queue["send"].popleft() if queue["send"] else None
                recv = queue["recv"].popleft() if queue["recv"] else None
                if send is None or recv is None or send.sizes != recv.sizes or send.dtypes != recv.dtypes:
                    found.append(Divergence(group, groups[group].group_desc, k, {src: send, dst: recv}, (src, dst)))
                    break
        return found
    return first_divergences


def _divergences_by_sorting(original):
    """A correct analysis written another way: two sorted passes — the collectives sorted by (group, seq, rank) and
    cut into runs of one seq; the messages numbered per (group, sender, receiver, op) and sorted by that number."""
    import itertools

    from communication.hang_lab import Divergence

    def first_divergences(records):
        found = []
        rows = sorted(((rec.group, rec.seq, rank, rec) for rank, recs in records.items() for rec in recs
                       if not rec.is_p2p), key=lambda row: row[:3])
        for group, in_group in itertools.groupby(rows, key=lambda row: row[0]):
            in_group = list(in_group)
            any_rec = in_group[0][3]
            members = [m for m in any_rec.group_ranks if m in records]
            oldest = {}
            for _, seq, rank, _ in in_group:
                oldest.setdefault(rank, seq)  # sorted by seq: a rank's first row is its oldest kept record
            start = max(oldest.values())
            for seq, same in itertools.groupby((row for row in in_group if row[1] >= start), key=lambda row: row[1]):
                posted = dict.fromkeys(members)
                posted.update({rank: rec for _, _, rank, rec in same})
                if None in posted.values() or len({rec.signature for rec in posted.values()}) != 1:
                    found.append(Divergence(group, any_rec.group_desc, seq, posted))
                    break
        numbered, counts = {}, {}
        for rank, recs in records.items():
            for rec in recs:
                if rec.is_p2p:
                    src, dst = (rank, rec.peer) if rec.op == "send" else (rec.peer, rank)
                    k = counts[rec.group, src, dst, rec.op] = counts.get((rec.group, src, dst, rec.op), 0) + 1
                    numbered.setdefault((rec.group, src, dst, k), {})[rec.op] = rec
        judged = set()
        for group, src, dst, k in sorted(numbered):
            if (group, src, dst) in judged or src not in records or dst not in records:
                continue
            send, recv = numbered[group, src, dst, k].get("send"), numbered[group, src, dst, k].get("recv")
            if send is None or recv is None or (send.sizes, send.dtypes) != (recv.sizes, recv.dtypes):
                desc = (send or recv).group_desc
                found.append(Divergence(group, desc, k, {src: send, dst: recv}, (src, dst)))
                judged.add((group, src, dst))
        return found
    return first_divergences


# ---- a5_1_4: DiLoCo --------------------------------------------------------------------------------------------
# Each replaces DiLoCo.outer_step; all reach the collectives through fault_tolerance.diloco at call time.

def _diloco_outer_step(sign=1.0, average_weights=False, reset_momentum=False, average_inner_state=False):
    def make(original):
        @torch.no_grad()
        def outer_step(self):
            import fault_tolerance.diloco as diloco

            size = diloco.group_size(self.group)
            if reset_momentum:  # a new outer optimizer every round: its momentum starts from zero each time
                group = self.outer_optimizer.param_groups[0]
                self.outer_optimizer = torch.optim.SGD(self.global_params, lr=group["lr"],
                                                       momentum=group["momentum"], nesterov=group["nesterov"])
            if average_weights:  # the local weights averaged and taken as the global ones; no outer optimizer
                for local, shared in zip(self.params, self.global_params):
                    shared.copy_(diloco.all_reduce(local.detach().clone(), group=self.group) / size)
            else:
                for local, shared in zip(self.params, self.global_params):
                    shared.grad = diloco.all_reduce(sign * (shared - local), group=self.group) / size
                self.outer_optimizer.step()
                self.outer_optimizer.zero_grad(set_to_none=True)
            for local, shared in zip(self.params, self.global_params):
                local.copy_(shared)
            if average_inner_state:  # AdamW's moments averaged across the groups too
                for state in self.inner_optimizer.state.values():
                    for name in ("exp_avg", "exp_avg_sq"):
                        state[name].copy_(diloco.all_reduce(state[name], group=self.group) / size)
            self.outer_steps += 1
        return outer_step
    return make



# ---- a5_1_1: dataset partitioning -------------------------------------------------------------------------------

def _partitioner_cut(cut):
    """A DataPartitioner whose shuffled positions are cut by ``cut(order, sizes) -> [index lists]``."""
    def make(original):
        def __init__(self, data, sizes=(0.7, 0.2, 0.1), seed=1234):
            import random

            self.data, self.sizes, self.seed = data, list(sizes), seed
            order = list(range(len(data)))
            random.Random(seed).shuffle(order)
            self.partitions = cut(order, list(sizes))
        return __init__
    return make


def _floored(order, sizes):
    """Each part int(fraction * n) long, cut one after another: the remainder is never handed out."""
    out, start = [], 0
    for size in sizes:
        length = int(size * len(order))
        out.append(order[start:start + length])
        start += length
    return out


def _remainder_to_last(order, sizes):
    """Each part int(fraction * n) long, the last one taking whatever is left."""
    out, start = [], 0
    for size in sizes[:-1]:
        length = int(size * len(order))
        out.append(order[start:start + length])
        start += length
    return out + [order[start:]]


def _every_rank_shard_0(original):
    def partition_dataset(rank, world_size, dataset, batch_size=128, collate_fn=None, seed=1234):
        from torch.utils.data import DataLoader

        from data_parallel.partition import DataPartitioner

        if batch_size % world_size:
            raise ValueError(f"batch_size {batch_size} is not divisible by world_size {world_size}")
        partitioner = DataPartitioner(dataset, [1.0 / world_size] * world_size, seed)
        return DataLoader(partitioner.use(0), batch_size=batch_size // world_size, collate_fn=collate_fn)  # rank unused
    return partition_dataset


# ---- a5_1_2: gradient averaging ---------------------------------------------------------------------------------

def _average_gradients(world_divisor=False, dtype=None, skip_zero=False):
    """average_gradients with one thing changed: divided by the world's size, all-reduced in ``dtype``, or a
    gradient that is all zeros on this rank not all-reduced."""
    def make(original):
        def average_gradients(model, group=None):
            import torch.distributed as dist

            size = dist.get_world_size() if world_divisor else dist.get_world_size(group)
            for param in model.parameters():
                if param.grad is None or (skip_zero and not param.grad.any()):
                    continue
                if dtype is None:
                    dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)
                    param.grad /= size
                else:  # the message in a narrower dtype, to halve the bytes
                    low = param.grad.to(dtype)
                    dist.all_reduce(low, op=dist.ReduceOp.SUM, group=group)
                    param.grad.copy_(low / size)
        return average_gradients
    return make


# ---- a5_1_3: data-parallel training ------------------------------------------------------------------------------

def _epoch_batches(world=False, own_steps=False):
    """DataParallelTraining.epoch_batches sharding by the world's rank and size (and counting steps in the world),
    or letting every rank take as many steps as it has batches."""
    def make(original):
        def epoch_batches(self, epoch):
            import torch.distributed as dist

            from data_parallel.partition import partition_dataset
            from data_parallel.training import common_steps

            rank, size, group = (dist.get_rank(), dist.get_world_size(), None) if world else \
                (self.dp_rank, self.dp_size, self.dp_group)
            loader = partition_dataset(rank, size, self.data.train, self.config.batch_size, self.data.collate,
                                       seed=self.config.seed + epoch)
            if own_steps:
                steps = min(len(loader), self.config.max_batches or len(loader))
            else:
                steps = common_steps(len(loader), self.config.max_batches, group)
            self.order_dp = self.dp_size
            return loader, steps
        return epoch_batches
    return make


def _train_step_in_the_world(original):
    def train_step(self, batch):
        from course.epoch_runner import supervised_step
        from data_parallel.gradients import average_gradients

        return supervised_step(self.model, self.optimizer, batch, self.device,
                               after_backward=lambda m: average_gradients(m))  # the world, not the dp group
    return train_step


# ---- a5_1_4: DiLoCo (more) ---------------------------------------------------------------------------------------

def _diloco_in_the_world(divide_only=False, dtype=None):
    """DiLoCo.outer_step with the course's collectives called without the group (``all_reduce(x)`` and
    ``group_size()``: the world), or only ``group_size()`` so, or the pseudo-gradients all-reduced in ``dtype``."""
    def make(original):
        @torch.no_grad()
        def outer_step(self):
            import fault_tolerance.diloco as diloco

            size = diloco.group_size(self.group) if dtype is not None else diloco.group_size()
            group = self.group if divide_only or dtype is not None else None
            for local, shared in zip(self.params, self.global_params):
                delta = shared - local
                if dtype is not None:
                    delta = delta.to(dtype)
                shared.grad = (diloco.all_reduce(delta, group=group) / size).to(shared.dtype)
            self.outer_optimizer.step()
            self.outer_optimizer.zero_grad(set_to_none=True)
            for local, shared in zip(self.params, self.global_params):
                local.copy_(shared)
            self.outer_steps += 1
        return outer_step
    return make


# ---- a5_2_1 .. a5_2_6: pipelines ---------------------------------------------------------------------------------

def _clock_cycles_without_last_stage(original):
    def _clock_cycles(num_batches, num_partitions):
        m, n = num_batches, num_partitions
        for k in range(m + n - 1):
            yield [(k - j, j) for j in range(max(0, k - m + 1), min(k + 1, n - 1))]  # j < n - 1: the last stage idles
    return _clock_cycles


def _balance_of_the_first_stage(original):
    def _split_module(modules, balance=None):
        from torch import nn

        if balance is None:
            return original(modules, balance)
        layers = [module for _, module in modules.named_children()]
        per = balance[0]  # every stage as long as the first
        groups = [layers[s * per:(s + 1) * per] for s in range(len(balance))]
        groups[-1] = layers[(len(balance) - 1) * per:]
        return [nn.Sequential(*g) for g in groups], [torch.device("cpu")] * len(balance)
    return _split_module


def _pipe_forward(split):
    def make(original):
        def forward(self, x):
            from pipeline.clock_cycles import clock_cycles

            self._start_workers()
            try:
                batches = split(x, self.split_size)
                for schedule in clock_cycles(len(batches), len(self.partitions)):
                    self.compute(batches, schedule)
                return torch.cat(batches, dim=0)
            except BaseException:
                self._stop_workers()
                raise
        return forward
    return make


def _tied_gradients(skip_missing=False, world=False):
    def make(original):
        def __call__(self, tied):
            import torch.distributed as dist

            if self.group is None or tied is None:
                return
            if tied.grad is None:
                if skip_missing:  # nothing to add from this stage: no all-reduce here
                    return
                tied.grad = torch.zeros_like(tied)
            dist.all_reduce(tied.grad, op=dist.ReduceOp.SUM, group=None if world else self.group)
        return __call__
    return make


def _one_f_one_b_warmup_uncapped(original):
    def one_f_one_b_actions(rank, n_stages, micro_batches):
        warmup = n_stages - rank - 1  # not capped at m
        actions = [("F", i) for i in range(warmup)]
        next_backward = 0
        for i in range(warmup, micro_batches):
            actions += [("F", i), ("B", next_backward)]
            next_backward += 1
        return actions + [("B", i) for i in range(next_backward, micro_batches)]
    return one_f_one_b_actions


def _backward_keeps_in_flight(original):
    def backward_step(self, i):
        x, y = self.in_flight[i]  # read, not popped: the micro-batch stays "in flight" to the end of the step
        grad = None if self.is_last else self.recv(self.stage_index + 1)
        self.compute_backward(i, y, grad)
        if not self.is_first:
            self.send(x.grad, self.stage_index - 1)
    return backward_step


def _interleaved_rounds_of_p(original):
    def interleaved_1f1b_actions(rank, n_stages, micro_batches, virtual_stages):
        import pipeline.schedules as schedules

        saved = schedules.micro_batches_per_round
        schedules.micro_batches_per_round = lambda p, m: p if m < p else saved(p, m)  # rounds of p when m < p
        try:
            return original(rank, n_stages, micro_batches, virtual_stages)
        finally:
            schedules.micro_batches_per_round = saved
    return interleaved_1f1b_actions


def _input_grad_with_weights(original):
    def compute_input_grad(self, x, y, grad):
        if x.requires_grad:  # the whole backward (weights too), the graph kept for W
            torch.autograd.backward(y, grad, retain_graph=True)
    return compute_input_grad


def _zb_h1_defers_p_minus_rank(original):
    def zb_h1_actions(rank, n_stages, micro_batches):
        deferred = n_stages - 1 - rank  # the last rank defers none, the first p - 1: the ranks read backwards
        warmup = min(n_stages - rank - 1, micro_batches)
        actions, next_w = [("F", i) for i in range(warmup)], 0

        def backward(k):
            nonlocal next_w
            out = [("B", k)]
            if k >= deferred:
                out.append(("W", next_w))
                next_w += 1
            return out

        for k in range(micro_batches - warmup):
            actions += [("F", warmup + k)] + backward(k)
        for k in range(micro_batches - warmup, micro_batches):
            actions += backward(k)
        return actions + [("W", i) for i in range(next_w, micro_batches)]
    return zb_h1_actions


# ---- a5_3_1 .. a5_3_5: tensor parallelism ------------------------------------------------------------------------
# Autograd functions and modules are replaced method by method (every module that imported them sees the change).

def _static(function):
    return lambda original: staticmethod(function)


def _f_backward_in_the_world(ctx, grad):
    from course.collectives import all_reduce

    return all_reduce(grad), None  # ctx.group forgotten: the world


def _split_by_global_rank(original):
    def split_along_dim(x, dim, group=None):
        import torch.distributed as dist

        from course.collectives import group_size

        p = group_size(group)
        if x.size(dim) % p:
            raise ValueError(f"cannot split size {x.size(dim)} of dim {dim} into {p} equal chunks")
        return x.chunk(p, dim=dim)[dist.get_rank()].contiguous()  # the global rank, not the rank in the group
    return split_along_dim


def _g_forward_in_float32(ctx, x, group):
    from course.collectives import all_reduce

    ctx.group = group
    return all_reduce(x.float(), group)  # summed in float32 "for accuracy", never cast back


def _column_forward_without_group(original):
    def forward(self, x):
        import tensor_parallel.layers as layers

        if self.sequence_parallel:
            x = layers.gather_from_sequence_parallel_region(x, self.group)
        else:
            x = layers.copy_to_tensor_parallel_region(x)  # group forgotten: f's all-reduce over the world
        y = self.local(x)
        return layers.gather_from_tensor_parallel_region(y, self.group) if self.gather_output else y
    return forward


def _row_forward_without_group(original):
    def forward(self, x):
        import tensor_parallel.layers as layers

        if not self.input_is_parallel:
            x = layers.scatter_to_tensor_parallel_region(x, self.group)
        partial = self.local(x)
        if self.sequence_parallel:
            y = layers.reduce_scatter_to_sequence_parallel_region(partial, self.group)
        else:
            y = layers.reduce_from_tensor_parallel_region(partial)  # group forgotten: g's all-reduce over the world
        return y + self.bias if self.bias is not None else y
    return forward


def _vocab_embedding_in_the_world(original):
    def forward(self, input_ids):
        import torch.nn.functional as F

        from tensor_parallel.mappings import reduce_from_tensor_parallel_region

        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)
        local_ids = (input_ids - self.vocab_start).masked_fill(outside, 0)
        partial = F.embedding(local_ids, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tensor_parallel_region(partial)  # group forgotten
    return forward


def _vocab_cross_entropy_in_the_world(ctx, logits, target, ignore_index, group):
    from course.collectives import all_reduce, all_reduce_max, group_rank

    vocab_start = group_rank(group) * logits.size(-1)
    ctx.dtype = logits.dtype
    logits = logits if logits.dtype == torch.float64 else logits.float()
    valid = target != ignore_index
    global_max = all_reduce_max(logits.max(dim=-1).values)  # every sum and max over the world, not the group
    shifted = logits - global_max.unsqueeze(-1)
    local_target = target - vocab_start
    outside = (local_target < 0) | (local_target >= logits.size(-1))
    local_target = local_target.masked_fill(outside, 0)
    target_logit = all_reduce(shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0))
    exp = shifted.exp()
    sum_exp = all_reduce(exp.sum(dim=-1))
    loss = (sum_exp.log() - target_logit).masked_fill(~valid, 0.0)
    ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local_target, outside, valid)
    return loss


def _head_copy_without_group(original):
    def copy_to_tensor_parallel_region(x, group=None):
        from tensor_parallel.mappings import CopyToTensorParallelRegion

        return CopyToTensorParallelRegion.apply(x, None)  # the head's f called without the group: the world
    return copy_to_tensor_parallel_region


def _sequence_gather_in_the_world(ctx, x, group):
    from course.collectives import all_gather

    ctx.group = group
    return all_gather(x, 1)  # group forgotten: every rank's chunk of the world


def _partial_grads_synced_in_the_world(original):
    def sync_partial_grads(params, group=None):
        from course.collectives import all_reduce, group_size

        params = list(params)
        if not params or group_size(group) == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = all_reduce(torch.cat([g.reshape(-1) for g in grads]))  # the world, not the tp group
        offset = 0
        for p in params:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
    return sync_partial_grads


# ---- a5_4_1 .. a5_4_3: communication -----------------------------------------------------------------------------

def _ring(chunking="tensor_split", paired=True, wire_dtype=None, peers_by_group_rank=False):
    """ring_all_reduce with one thing changed: chunks of ``numel // p`` (the remainder never reduced), the messages
    sent before the receives are posted (``isend`` then ``recv``, not one batch), the messages in another dtype, or
    the neighbours addressed by their rank in the group instead of their global rank."""
    def make(original):
        def ring_all_reduce(tensor, op="sum", group=None, trace=None):
            import communication.ring as ring

            p, r, flat = ring._prepare(tensor, op, group)
            if p == 1:
                return ring._finish(tensor, flat, op, p)
            if chunking == "floor":
                n = flat.numel() // p
                chunks = [flat[c * n:(c + 1) * n] for c in range(p)]
            else:
                chunks = torch.tensor_split(flat, p)
            right, left = ring.global_rank(group, (r + 1) % p), ring.global_rank(group, (r - 1) % p)
            if peers_by_group_rank:
                right, left = (r + 1) % p, (r - 1) % p
            for phase in ("reduce_scatter", "all_gather"):
                for step in range(p - 1):
                    if phase == "reduce_scatter":
                        send_c, recv_c = (r - step) % p, (r - step - 1) % p
                    else:
                        send_c, recv_c = (r + 1 - step) % p, (r - step) % p
                    if trace is not None:
                        trace.append({"phase": phase, "step": step, "rank": r, "send_chunk": send_c,
                                      "recv_chunk": recv_c, "dst": (r + 1) % p, "src": (r - 1) % p})
                    outgoing = chunks[send_c].contiguous()
                    buffer = torch.empty_like(chunks[recv_c])
                    if wire_dtype is not None:
                        outgoing, buffer = outgoing.to(wire_dtype), buffer.to(wire_dtype)
                    if paired:
                        incoming = ring.send_recv(outgoing, right, buffer, left, group)
                    else:
                        work = ring.isend(outgoing, right, group=group)
                        ring.recv(buffer, left, group=group)
                        work.wait()
                        incoming = buffer
                    incoming = incoming.to(flat.dtype)
                    if phase == "reduce_scatter":
                        chunks[recv_c].add_(incoming)
                    else:
                        chunks[recv_c].copy_(incoming)
            return ring._finish(tensor, flat, op, p)
        return ring_all_reduce
    return make


def _bucket_parameters(close_at_capacity=False, drop_last=False):
    def make(original):
        def bucket_parameters(sizes_bytes, bucket_bytes):
            if bucket_bytes <= 0:
                raise ValueError(f"bucket size must be > 0 bytes, not {bucket_bytes}")
            buckets, current, filled = [], [], 0
            for i in reversed(range(len(sizes_bytes))):
                full = filled + sizes_bytes[i] >= bucket_bytes if close_at_capacity else \
                    filled + sizes_bytes[i] > bucket_bytes
                if current and full:
                    buckets.append(current)
                    current, filled = [], 0
                current.append(i)
                filled += sizes_bytes[i]
            if current and not drop_last:
                buckets.append(current)
            return buckets
        return bucket_parameters
    return make


def _buckets_launched_when_full(original):
    def grad_ready(self, i, grad):
        b = self.bucket_of[i]
        self._slot(i).copy_(grad.reshape(-1))
        self.buffers[b][self._flag_index(i)] = 1
        if not self.ready[i]:
            self.ready[i] = True
            self.pending[b] -= 1
        if self.overlap and self.pending[b] == 0 and self.works[b] is None:
            self._launch(b)  # this bucket at once, whatever the buckets before it
            self.launched += 1
    return grad_ready


def _finish(over_users=False):
    """BucketedReducer.finish launching every bucket not launched yet (in bucket order: those a launch-as-they-fill
    grad_ready left), and dividing each gradient by the group's size or, ``over_users``, by the number of ranks that
    had it."""
    def make(original):
        def finish(self):
            for b in range(len(self.buckets)):
                if self.works[b] is None:
                    for i in self.buckets[b]:
                        if not self.ready[i]:
                            self._slot(i).zero_()
                            self.buffers[b][self._flag_index(i)] = 0
                    self._launch(b)
            self.launched = len(self.buckets)
            for work in self.works:
                work.wait()
            for i, p in enumerate(self.params):
                users = float(self.buffers[self.bucket_of[i]][self._flag_index(i)])
                if users == 0:
                    continue
                avg = self._slot(i).view_as(p) / (users if over_users else self.world_size)
                if p.grad is None:
                    p.grad = avg
                else:
                    p.grad.copy_(avg)
            self.active = False
        return finish
    return make


def _topk_compress(values_dtype=None, residual_default_dtype=False):
    def make(original):
        def topk_compress(grad, residual, ratio):
            if not 0 < ratio <= 1:
                raise ValueError(f"top-k ratio must be in (0, 1], not {ratio}")
            k = max(1, int(-(-ratio * grad.numel() // 1)))
            acc = (grad + residual).reshape(-1)
            indices = acc.abs().topk(k, sorted=False).indices
            values = acc[indices] if values_dtype is None else acc[indices].to(values_dtype)
            if residual_default_dtype:  # a fresh buffer in the default dtype
                new_residual = torch.zeros(acc.shape)
                new_residual.copy_(acc)
            else:
                new_residual = acc.clone()
            new_residual[indices] = 0
            return indices, values, new_residual.view_as(grad)
        return topk_compress
    return make


# ---- a5_6_1 .. a5_6_3: the 3D mesh and step -----------------------------------------------------------------------

def _coordinates_dp_fastest(original):
    def coordinates(rank, dp, pp, tp):
        return (rank // (dp * tp), rank % dp, rank // dp % tp)  # dp varies fastest, not tp
    return coordinates


def _tp_group_from_the_rank(original):
    def group_ranks(rank, dp, pp, tp):
        from three_d.mesh_arithmetic import coordinates

        s, d, t = coordinates(rank, dp, pp, tp)
        at = lambda s_, d_, t_: (s_ * dp + d_) * tp + t_  # noqa: E731
        return {"dp": [at(s, i, t) for i in range(dp)], "pp": [at(i, d, t) for i in range(pp)],
                "tp": [rank + i for i in range(tp)]}  # counted from the rank, not from its group's first rank
    return group_ranks


def _stage_head_copy_without_group(original):
    def forward(self, x):
        import torch.nn.functional as F

        import tensor_parallel

        if self.is_first:
            positions = torch.arange(x.size(1), device=x.device)[None]
            h = self.drop(self.wte(x) + self.wpe(positions))
        elif self.scatter_gather:
            h = tensor_parallel.gather_from_tensor_parallel_region(x, self.group)
        else:
            h = x
        bias = tensor_parallel.attention_bias(None, h.size(0), h.size(1), h.dtype, h.device)
        for block in self.h.values():
            h = block(h, bias)
        if self.is_last:
            h = tensor_parallel.copy_to_tensor_parallel_region(self.ln_f(h))  # group forgotten: the world
            return self._mask_padding(F.linear(h, self.head_weight()))
        if self.scatter_gather:
            h = tensor_parallel.scatter_to_tensor_parallel_region(h, self.group)
        return h
    return forward


def _dp_average_over_the_world(original):
    def average_over_dp(stage, dp_group):
        import torch.distributed as dist

        from course.collectives import all_reduce, group_size

        params = [p for p in stage.parameters() if p.grad is not None]
        if not params or group_size(dp_group) == 1:
            return
        flat = all_reduce(torch.cat([p.grad.reshape(-1) for p in params]), dp_group) / dist.get_world_size()
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()
    return average_over_dp


def _grad_norm(every_tp_rank=False, skip_pp=False):
    def make(original):
        def global_grad_norm(stage, tp_group, pp_group, tp_rank):
            import math

            from course.collectives import all_reduce

            sharded = stage.sharded_parameters()
            tied_copy = stage.lm_head.weight if stage.lm_head is not None else None
            square = torch.zeros((), dtype=torch.float64, device=next(stage.parameters()).device)
            for p in stage.parameters():
                if p.grad is None or p is tied_copy:
                    continue
                if id(p) not in sharded and tp_rank != 0 and not every_tp_rank:
                    continue
                square = square + p.grad.detach().double().pow(2).sum()
            square = all_reduce(square.reshape(1), tp_group)
            if not skip_pp:
                square = all_reduce(square, pp_group)
            return math.sqrt(float(square))
        return global_grad_norm
    return make


# ---- a5_7_1 .. a5_7_3: context parallelism -----------------------------------------------------------------------

def _online_update_in_the_inputs_dtype(original):
    def online_softmax_update(state, q, k, v, scale, mask=None):
        from context_parallel.online_softmax import SoftmaxState

        scores = ((q @ k.transpose(-2, -1)) * scale).to(state.acc.dtype)  # the products in q's dtype
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        m_new = torch.maximum(state.m, scores.amax(dim=-1))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(scores - m_safe[..., None])
        rescale = torch.exp(state.m - m_safe)
        return SoftmaxState(m_new, rescale * state.l + p.sum(dim=-1),
                            rescale[..., None] * state.acc + (p.to(v.dtype) @ v).to(state.acc.dtype))
    return online_softmax_update


def _block_gradients_in_the_inputs_dtype(original):
    def block_gradients(q, k, v, dout, lse, delta, scale, mask=None):
        dtype = q.dtype  # the inputs' dtype, not the statistics'
        lse, delta = lse.to(dtype), delta.to(dtype)
        scores = (q @ k.transpose(-2, -1)) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        p = torch.exp(scores - lse_safe[..., None])
        dv = p.transpose(-2, -1) @ dout.to(dtype)
        ds = p * (dout.to(dtype) @ v.transpose(-2, -1) - delta[..., None])
        out = (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv
        return tuple(t.to(torch.promote_types(t.dtype, torch.float32)) for t in out)
    return block_gradients


def _causal_block_off_by_one(original):
    def causal_block(q_pos, k_pos):
        if int(k_pos.min()) >= int(q_pos.max()):  # >=: a tile whose first key is the last query's own is skipped
            return False, None
        if int(k_pos.max()) <= int(q_pos.min()):
            return True, None
        return True, k_pos[None, :] <= q_pos[:, None]
    return causal_block


def _ring_forward(buffer_default_dtype=False):
    def make(original):
        def forward(ctx, q, k, v, layout, group, causal, block_size, scale, stats):
            import importlib

            ra = importlib.import_module("context_parallel.ring_attention")  # the package's ring_attention: a function

            p, r = ra.group_size(group), ra.group_rank(group)
            right, left = ra.global_rank(group, (r + 1) % p), ra.global_rank(group, (r - 1) % p)
            q_pos = layout.positions(r)
            state = ra.SoftmaxState.empty(q, v.size(-1))
            kv = torch.stack([k, v]).contiguous()
            with ra._StepRecorder(stats, "forward", q.device, layout):
                for step in range(p):
                    pending = None
                    if step < p - 1:
                        incoming = torch.empty(kv.shape, device=kv.device) if buffer_default_dtype else \
                            torch.empty_like(kv)
                        pending = ra.start_exchange([ra.P2P("send", kv, right), ra.P2P("recv", incoming, left)], group)
                    src = (r - step) % p
                    ra.attend_blocks(state, q, kv[0], kv[1], q_pos, layout.positions(src), scale, block_size, causal)
                    if pending is not None:
                        pending.wait()
                        kv = incoming
            out, lse = ra.finish(state)
            out = out.to(q.dtype)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.layout, ctx.group, ctx.causal, ctx.block_size, ctx.scale, ctx.stats = (layout, group, causal,
                                                                                      block_size, scale, stats)
            return out
        return staticmethod(forward)
    return make


def _zigzag_pairs_from_the_middle(original):
    def chunk_ids(layout, cp_rank, cp):
        if layout == "contiguous":
            return [cp_rank], cp
        return [cp_rank, cp + cp_rank], 2 * cp  # the second chunk counted from the middle, not mirrored
    return chunk_ids


def _ulysses_heads_to_sequence_in_the_world(ctx, x, group):
    from context_parallel.ulysses import HEAD_DIM, SEQ_DIM, all_to_all

    ctx.group = group
    return all_to_all(x, scatter_dim=SEQ_DIM, gather_dim=HEAD_DIM, group=None)  # the world, not the cp group


def _with_registry(name: str, make_function):
    """A make for a schedule's action-list function that also swaps it into ``pipeline.schedules.SCHEDULES``
    (whose entry for ``name`` may hold the function itself)."""
    def make(original):
        if isinstance(original, dict):  # the registry
            import dataclasses

            import pipeline.schedules as schedules

            function = make_function(getattr(schedules, _REGISTRY_FUNCTIONS[name]))
            entry = original[name]
            return {**original,
                    name: dataclasses.replace(entry, actions=lambda r, p, m, v: _call(function, r, p, m, v))}
        return make_function(original)
    return make


_REGISTRY_FUNCTIONS = {"1f1b": "one_f_one_b_actions", "interleaved": "interleaved_1f1b_actions",
                       "zb-h1": "zb_h1_actions"}


def _call(function, r, p, m, v):
    import inspect

    return function(r, p, m, v) if len(inspect.signature(function).parameters) == 4 else function(r, p, m)


def _buckets_launched_when_full_and_finished(original):
    return _finish()(original) if original.__name__ == "finish" else _buckets_launched_when_full(original)

PLANTED: dict[str, Planted] = {
    "diloco pseudo-gradient sign flipped": Planted(
        "a5_1_4", "the pseudo-gradient taken as local - global", ("fault_tolerance.diloco:DiLoCo.outer_step",),
        _diloco_outer_step(sign=-1.0)),
    "diloco weights averaged": Planted(
        "a5_1_4", "the groups' weights averaged instead of their pseudo-gradients stepped by the outer SGD",
        ("fault_tolerance.diloco:DiLoCo.outer_step",), _diloco_outer_step(average_weights=True)),
    "diloco outer momentum reset every round": Planted(
        "a5_1_4", "a fresh outer optimizer every round (its Nesterov momentum lost)",
        ("fault_tolerance.diloco:DiLoCo.outer_step",), _diloco_outer_step(reset_momentum=True)),
    "diloco inner optimizer state averaged": Planted(
        "a5_1_4", "the inner AdamW moments averaged across the groups at the outer step",
        ("fault_tolerance.diloco:DiLoCo.outer_step",), _diloco_outer_step(average_inner_state=True)),
    "v schedule on the interleaved placement": Planted(
        "a5_2_7", "DualPipeV written as interleaved 1F1B with 2 chunks (chunk c on stage c * p + rank, not the V)",
        ("pipeline.schedules:dualpipev_actions",), _v_on_the_interleaved_placement),
    "zbv on the interleaved placement": Planted(
        "a5_2_7", "ZB-V written as interleaved 1F1B with 2 chunks", ("pipeline.schedules:zbv_actions",),
        _v_on_the_interleaved_placement),
    "dualpipev W before its B": Planted(
        "a5_2_7", "a weight gradient issued before its input gradient", ("pipeline.schedules:dualpipev_actions",),
        _w_before_its_b),
    "zbv W before its B": Planted(
        "a5_2_7", "a weight gradient issued before its input gradient", ("pipeline.schedules:zbv_actions",),
        _w_before_its_b),
    "dualpipev without pairs": Planted(
        "a5_2_7", "the forward and backward of the steady state issued one after the other, not paired",
        ("pipeline.schedules:dualpipev_actions",), _pairs_unpaired),
    "dualpipev warm-up one longer": Planted(
        "a5_2_7", "one chunk-0 forward too many before the first chunk-1 forward (off-by-one warm-up)",
        ("pipeline.schedules:dualpipev_actions",), _warm_up_one_longer),
    "zbv warm-up one longer": Planted(
        "a5_2_7", "one chunk-0 forward too many before the first chunk-1 forward (off-by-one warm-up)",
        ("pipeline.schedules:zbv_actions",), _warm_up_one_longer),
    "zbv reuses ZB-H1's order": Planted(
        "a5_2_7", "ZB-H1's order run on chunk 0, then again on chunk 1", ("pipeline.schedules:zbv_actions",),
        _zb_h1_on_each_chunk),
    "divergences by place in the list": Planted(
        "a5_4_4", "each group's records lined up by their place in a rank's list instead of their seq",
        ("communication.hang_lab:first_divergences",), _divergences(align="position")),
    "divergences ignoring the group": Planted(
        "a5_4_4", "every collective of a rank lined up by seq, whatever its group",
        ("communication.hang_lab:first_divergences",), _divergences(align="ignore_group")),
    "the last divergence": Planted(
        "a5_4_4", "the last seq at which a group's ranks disagree instead of the first",
        ("communication.hang_lab:first_divergences",), _divergences(pick="last")),
    "sends and receives lined up like collectives": Planted(
        "a5_4_4", "point-to-point records lined up by p2p_seq_id among the group's ranks, as if collectives",
        ("communication.hang_lab:first_divergences",), _divergences(p2p="seq")),
    "every rank a member of every group": Planted(
        "a5_4_4", "a rank that is no member of a group counted as missing from its collectives",
        ("communication.hang_lab:first_divergences",), _divergences(members="all")),
    "collectives compared by name": Planted(
        "a5_4_4", "collectives compared by operation name only, not sizes and dtypes",
        ("communication.hang_lab:first_divergences",), _divergences(compare="op")),
    "only the receives walked": Planted(
        "a5_4_4", "each receive looks for its send; a send that no receive ever meets is never seen",
        ("communication.hang_lab:first_divergences",), _divergences(walk="receives")),
    "messages compared by size only": Planted(
        "a5_4_4", "a send and its receive compared by sizes, not dtypes (float32 sent, float64 received)",
        ("communication.hang_lab:first_divergences",), _divergences(message="sizes")),
    "a pair judged without one rank's dump": Planted(
        "a5_4_4", "messages to and from a rank that left no dump reported as never received or never sent",
        ("communication.hang_lab:first_divergences",), _divergences(undumped="judge")),
    "collectives compared by hand-written fields": Planted(
        "a5_4_4", "collectives compared by (op, sizes, dtypes) instead of Record.signature (an uneven all-to-all "
        "diverges)", ("communication.hang_lab:first_divergences",), _divergences(compare="fields")),
    "ulysses without scale": Planted(
        "a5_7_3", "Ulysses attention that never passes scale to the local attention",
        ("context_parallel:ulysses_attention", "context_parallel.ulysses:ulysses_attention"), _ulysses_without_scale),
    "router softmax in the logits' dtype": Planted(
        "a5_8_1", "the router's softmax taken in the logits' own dtype (bf16 / fp16 probabilities)",
        ("moe.router:route",), _route(lambda z: torch.softmax(z, dim=-1))),
    "router softmax cast afterwards": Planted(
        "a5_8_1", "the router's softmax taken in the logits' dtype, then cast to float32",
        ("moe.router:route",), _route(lambda z: torch.softmax(z, dim=-1).float())),
    "router z-loss in the logits' dtype": Planted(
        "a5_8_1", "the z-loss's logsumexp taken in the logits' own dtype (a bf16 z-loss)",
        ("moe.losses:router_z_loss", "moe.layer:router_z_loss"), _z_loss_in_the_logits_dtype),
    "unpermute gates read token-major": Planted(
        "a5_8_1", "the combine weights each row by the gate at t * k + c of the choice-major pair c * T + t",
        ("moe.permutation:unpermute", "moe.layer:unpermute"), _unpermute_gates_token_major),
    "counts without the idle last experts": Planted(
        "a5_8_1", "the rows per expert counted without minlength: experts after the last one used are missing",
        ("moe.permutation:permute", "moe.layer:permute"), _counts_without_minlength),
    "capacity rounded down": Planted(
        "a5_8_1", "the expert capacity rounded down (an uneven share loses its fraction)",
        ("moe.capacity:expert_capacity", "moe.layer:expert_capacity"), _capacity_rounded_down),
    "counts not exchanged": Planted(
        "a5_8_2", "exchange_counts returns this rank's own counts", ("moe.expert_parallel:exchange_counts",),
        _counts_not_exchanged),
    "received counts transposed": Planted(
        "a5_8_2", "the exchanged counts read as [local expert][source rank]", ("moe.expert_parallel:exchange_counts",),
        _counts_transposed),
    "output splits from local counts": Planted(
        "a5_8_2", "dispatch expects from each rank what it sends to it",
        ("moe.expert_parallel:dispatch", "moe.layer:dispatch"),
        _output_splits_from_local_counts),
    "backward splits not swapped": Planted(
        "a5_8_2", "the all-to-all's backward pass sends with the forward pass's splits",
        ("moe.all_to_all:_AllToAll.backward",), _backward_splits_not_swapped),
    "rows sent in float32": Planted(
        "a5_8_2", "dispatch casts the rows to float32 before the all-to-all (bf16 rows travel as fp32)",
        ("moe.expert_parallel:dispatch", "moe.layer:dispatch"), _rows_sent_in_float32),
    "counts exchanged in the world": Planted(
        "a5_8_2", "the expert counts exchanged among every rank instead of the ep group",
        ("moe.expert_parallel:exchange_counts",), _counts_exchanged_in_the_world),
    "splits assumed even": Planted(
        "a5_8_2", "dispatch and combine send and expect the same number of rows to and from every rank",
        ("moe.expert_parallel:all_to_all",), _even_splits),
    "gradients over the world size": Planted(
        "a5_8_3", "EP x DP gradients divided by dist.get_world_size() instead of the dp x cp group's size",
        ("moe.gradients:sync_moe_gradients",), _gradients_over_world_size),
    "expert gradients reduced in the dp group": Planted(
        "a5_8_3", "the experts' gradients all-reduced over the dp x cp group (other experts' gradients added)",
        ("moe.gradients:sync_moe_gradients",), _expert_gradients(group="dp")),
    "expert gradients averaged over their replicas": Planted(
        "a5_8_3", "the experts' gradients divided by the edp group's size instead of dp x cp",
        ("moe.gradients:sync_moe_gradients",), _expert_gradients(divisor="edp")),
    "deepseek softmax scores": Planted(
        "a5_8_4", "a softmax over the experts instead of each expert's sigmoid",
        ("moe.deepseek_router:deepseek_route",), _deepseek_route(softmax=True)),
    "deepseek bias in the gates": Planted(
        "a5_8_4", "the selection bias added to the gates too", ("moe.deepseek_router:deepseek_route",),
        _deepseek_route(bias_in_gates=True)),
    "deepseek gates normalised over all experts": Planted(
        "a5_8_4", "the chosen scores divided by the sum over all experts, not over the chosen k",
        ("moe.deepseek_router:deepseek_route",), _deepseek_route(normalise_all=True)),
    "deepseek group score from the max": Planted(
        "a5_8_4", "each group scored by its best expert instead of the sum of its best two",
        ("moe.deepseek_router:deepseek_route",), _deepseek_route(group_max=True)),
    "deepseek routed scaling factor omitted": Planted(
        "a5_8_4", "the gates not multiplied by the routed scaling factor", ("moe.deepseek_router:deepseek_route",),
        _deepseek_route(scale=False)),
    "deepseek sigmoid in the logits' dtype": Planted(
        "a5_8_4", "the sigmoid affinities taken in the logits' own dtype (bf16 / fp16 affinities, gates and balance "
                  "statistics)", ("moe.deepseek_router:deepseek_route",), _deepseek_route(precision="logits")),
    "deepseek sigmoid cast afterwards": Planted(
        "a5_8_4", "the sigmoid taken in the logits' dtype, then cast to float32",
        ("moe.deepseek_router:deepseek_route",), _deepseek_route(precision="cast")),
    "deepseek gates of the unbiased top-k": Planted(
        "a5_8_4", "the gates are the k largest unbiased scores, not the scores of the experts the bias chose",
        ("moe.deepseek_router:deepseek_route",), _deepseek_route(unbiased_gates=True)),
    "deepseek bias moved by the relative imbalance": Planted(
        "a5_8_4", "the bias moved by gamma (mean - load) / mean instead of gamma sign(mean - load)",
        ("moe.deepseek_router:updated_bias",), _bias_update_proportional),
    "deepseek bias update sign flipped": Planted(
        "a5_8_4", "the bias of overloaded experts raised, of underloaded ones lowered",
        ("moe.deepseek_router:updated_bias",), _bias_update_sign_flipped),
    "deepseek shared experts omitted": Planted(
        "a5_8_4", "the shared experts' output not added", ("moe.deepseek_router:add_shared_experts",
                                                           "moe.layer:add_shared_experts"), _shared_experts_omitted),
    "quantization scale per tensor": Planted(
        "a5_5_5", "one scale (the whole tensor's max|x| / 127) for every block",
        ("memory.zeropp:quantize_blockwise",),
        _quantize(lambda b: (b.abs().max() / 127).expand(b.shape[0]).clone())),
    "quantization scale from the mean": Planted(
        "a5_5_5", "each block's scale from its mean |x| instead of its max",
        ("memory.zeropp:quantize_blockwise",), _quantize(lambda b: b.abs().mean(dim=1) / 127)),
    "quantization by truncation": Planted(
        "a5_5_5", "x / scale truncated toward zero instead of rounded to nearest",
        ("memory.zeropp:quantize_blockwise",), _quantize(lambda b: b.abs().amax(dim=1) / 127, torch.trunc)),
    "gathered weights not dequantized": Planted(
        "a5_5_5", "qwZ's all-gather returns the int8 levels as the weights", ("memory.zeropp:quantized_all_gather",),
        _gathered_without_dequantizing),
    "hpz backward all-gather in the dp group": Planted(
        "a5_5_5", "hpZ's backward all-gather of the fp32 slices over the whole dp group",
        ("memory.zeropp:ZeroPPUnit.gather",), _backward_gather_in_the_dp_group),
    "qgz sums quantized values": Planted(
        "a5_5_5", "qgZ sums the received int8 levels before dequantizing them",
        ("memory.zeropp:quantized_reduce_scatter",), _qgz(_levels_summed)),
    "qwz gathers fp32 values": Planted(
        "a5_5_5", "qwZ quantizes and dequantizes locally, then all-gathers the fp32 slices (the same numbers, 4 "
                  "bytes each on the wire)", ("memory.zeropp:quantized_all_gather",), _gathered_dequantized),
    "qgz scales read transposed": Planted(
        "a5_5_5", "qgZ's received scales read as [block][rank]: each chunk dequantized with other ranks' scales",
        ("memory.zeropp:quantized_reduce_scatter",), _qgz(_scales_transposed)),
    "hpz secondary slice by the dp rank": Planted(
        "a5_5_5", "hpZ's secondary slice indexed by the rank in the dp group, not in the node-sized group",
        ("memory.zeropp:ZeroPPUnit.post_forward",), _secondary_slice_by_dp_rank),
    "dequantize in whole blocks": Planted(
        "a5_5_5", "dequantize repeats every scale a whole block, the short last block not cut",
        ("memory.zeropp:dequantize_blockwise",), _dequantized_in_whole_blocks),
    "zero1 in the world, not its group": Planted(
        "a5_5_1", "ZeRO-1's gradient all-reduce over every rank instead of the dp group",
        ("memory.zero:ZeroOptimizer._reduce_stage1",), _in_the_world),
    "shard range without padding": Planted(
        "a5_5_1", "slices of ceil(numel / dp) with the last one shorter, the buffer not padded",
        ("memory.zero:shard_range", "memory.fsdp:shard_range"), _shard_range_unpadded),
    "zero1 grads all from the buffer's start": Planted(
        "a5_5_1", "every parameter's grad a view of the averaged buffer at offset 0 (not its own elements)",
        ("memory.zero:ZeroOptimizer._reduce_stage1",), _zero1_grads_at_the_start),
    "zero2 in the world, not its group": Planted(
        "a5_5_2", "ZeRO-2's gradient reduce-scatter over every rank instead of the dp group",
        ("memory.zero:ZeroOptimizer._reduce_stage2",), _in_the_world),
    "zero3 in the world, not its group": Planted(
        "a5_5_3", "ZeRO-3's gradient reduce-scatter over every rank instead of the unit's group",
        ("memory.fsdp:ShardedUnit.reduce_gradients",), _in_the_world),
    "zero1 averages the slice only": Planted(
        "a5_5_1", "ZeRO-1 gives the optimizer's slice the mean gradient and leaves every param.grad the rank's own",
        ("memory.zero:ZeroOptimizer._reduce_stage1",), _zero1_slice_only),
    "checkpoint without the forward's autocast": Planted(
        "a5_5_4", "the recomputation runs without the forward pass's autocast state (another dtype)",
        ("memory.checkpointing:CheckpointFunction",), _checkpoint_function(save_gpu=True, fork_gpu=True)),
    "checkpoint without the CPU's random state": Planted(
        "a5_5_4", "the recomputation draws its dropout masks from where the CPU generator is now",
        ("memory.checkpointing:CheckpointFunction",),
        _checkpoint_function(save_gpu=True, fork_gpu=True, restore_cpu=False)),
    "checkpoint restores the CPU generator only": Planted(
        "a5_5_4", "activation checkpointing that saves and restores only the CPU's random state",
        ("memory.checkpointing:CheckpointFunction",), _checkpoint_function(save_gpu=False, fork_gpu=False)),
    "checkpoint restores the GPU generator without fork_rng": Planted(
        "a5_5_4", "the GPU's random state restored for the recomputation, the caller's not put back",
        ("memory.checkpointing:CheckpointFunction",), _checkpoint_function(save_gpu=True, fork_gpu=False)),
    # ---- reviewed per class (issue 53, item 3): unmatched, mistyped, missing rank, legitimately uneven ----
    "partition parts floored, the remainder dropped": Planted(
        "a5_1_1", "each part int(fraction * n) long: the n - sum of them last examples are in no shard",
        ("data_parallel.partition:DataPartitioner.__init__",), _partitioner_cut(_floored)),
    "partition remainder to the last part": Planted(
        "a5_1_1", "each part int(fraction * n) long and the last one the rest (25, 25, 25, 28 for 103 over 4)",
        ("data_parallel.partition:DataPartitioner.__init__",), _partitioner_cut(_remainder_to_last)),
    "every rank loads shard 0": Planted(
        "a5_1_1", "partition_dataset serves partition 0 whatever the rank",
        ("data_parallel.partition:partition_dataset", "data_parallel:partition_dataset",
         "data_parallel.training:partition_dataset", "tests.data_parallel.test_partition:partition_dataset"),
        _every_rank_shard_0),
    "gradients averaged over the world's size": Planted(
        "a5_1_2", "all-reduced in the group, divided by dist.get_world_size() (the world's size)",
        ("data_parallel.gradients:average_gradients", "data_parallel:average_gradients",
         "data_parallel.training:average_gradients"), _average_gradients(world_divisor=True)),
    "gradients all-reduced in bf16": Planted(
        "a5_1_2", "each gradient cast to bfloat16 for the all-reduce, the mean copied back",
        ("data_parallel.gradients:average_gradients", "data_parallel:average_gradients",
         "data_parallel.training:average_gradients"), _average_gradients(dtype=torch.bfloat16)),
    "zero gradients not all-reduced": Planted(
        "a5_1_2", "a gradient that is all zeros on this rank skipped: the other ranks' all-reduce of it is unmatched",
        ("data_parallel.gradients:average_gradients", "data_parallel:average_gradients",
         "data_parallel.training:average_gradients"), _average_gradients(skip_zero=True)),
    "epoch sharded by the world's rank": Planted(
        "a5_1_3", "the epoch's shard and its step count by the world's rank and size, not the dp group's",
        ("data_parallel.training:DataParallelTraining.epoch_batches",), _epoch_batches(world=True)),
    "every rank steps through its own batches": Planted(
        "a5_1_3", "each rank takes as many steps as it has batches: the rank with one more all-reduces alone",
        ("data_parallel.training:DataParallelTraining.epoch_batches",), _epoch_batches(own_steps=True)),
    "dp step averaged over the world": Planted(
        "a5_1_3", "train_step averages the gradients over the world (average_gradients without the dp group)",
        ("data_parallel.training:DataParallelTraining.train_step",), _train_step_in_the_world),
    "diloco all-reduce over the world": Planted(
        "a5_1_4", "all_reduce(x) and group_size() without the group: averaged over the world",
        ("fault_tolerance.diloco:DiLoCo.outer_step",), _diloco_in_the_world()),
    "diloco mean over the world's size": Planted(
        "a5_1_4", "the pseudo-gradients summed in the group, divided by group_size() (the world's size)",
        ("fault_tolerance.diloco:DiLoCo.outer_step",), _diloco_in_the_world(divide_only=True)),
    "diloco pseudo-gradients all-reduced in float32": Planted(
        "a5_1_4", "the pseudo-gradients cast to float32 for the all-reduce (float64 weights)",
        ("fault_tolerance.diloco:DiLoCo.outer_step",), _diloco_in_the_world(dtype=torch.float32)),
    "clock cycles leave the last stage out": Planted(
        "a5_2_1", "stages j < n - 1 only: the last stage never gets a task",
        ("pipeline.clock_cycles:_clock_cycles", "pipeline.clock_cycles:clock_cycles", "pipeline:clock_cycles",
         "pipeline.pipe:clock_cycles", "tests.pipeline.test_clock_cycles_and_split:_clock_cycles"),
        _clock_cycles_without_last_stage),
    "stages cut by the first stage's length": Planted(
        "a5_2_1", "a balance read as stages as long as its first entry, the last stage taking the rest",
        ("pipeline.partition:_split_module", "pipeline.partition:split_module", "pipeline:split_module",
         "pipeline.pipe:split_module", "tests.pipeline.test_clock_cycles_and_split:_split_module"),
        _balance_of_the_first_stage),
    "pipe cuts split_size chunks": Planted(
        "a5_2_2", "torch.chunk(x, split_size): split_size micro-batches instead of micro-batches of split_size rows",
        ("pipeline.pipe:Pipe.forward",), _pipe_forward(lambda x, s: list(torch.chunk(x, s)))),
    "pipe drops the short last micro-batch": Planted(
        "a5_2_2", "only whole micro-batches of split_size rows: the rows of a short last one are lost",
        ("pipeline.pipe:Pipe.forward",),
        _pipe_forward(lambda x, s: list(torch.split(x[:max(s, x.size(0) // s * s)], s)))),
    "tied gradient skipped when missing": Planted(
        "a5_2_3", "a stage without a tied gradient returns without the all-reduce its peer waits in",
        ("pipeline.gpt2_stages:TiedGradients.__call__",), _tied_gradients(skip_missing=True)),
    "tied gradient summed over the world": Planted(
        "a5_2_3", "the tied gradient all-reduced over the world instead of the embedding group",
        ("pipeline.gpt2_stages:TiedGradients.__call__",), _tied_gradients(world=True)),
    "1f1b warm-up not capped at m": Planted(
        "a5_2_4", "p - rank - 1 warm-up forwards even when there are fewer micro-batches",
        ("pipeline.schedules:one_f_one_b_actions", "pipeline:one_f_one_b_actions",
         "tests.pipeline.test_gpipe_and_1f1b:one_f_one_b_actions"), _one_f_one_b_warmup_uncapped),
    "backward keeps the micro-batch in flight": Planted(
        "a5_2_4", "backward_step reads in_flight[i] without removing it (activations held to the end of the step)",
        ("pipeline.stage_runner:StageRunner.backward_step",), _backward_keeps_in_flight),
    "interleaved rounds of p when m < p": Planted(
        "a5_2_5", "rounds of p micro-batches per chunk even when m < p (q = p instead of min(m, p))",
        ("pipeline.schedules:interleaved_1f1b_actions", "pipeline:interleaved_1f1b_actions",
         "tests.pipeline.test_interleaved:interleaved_1f1b_actions", "pipeline.schedules:SCHEDULES"),
        _with_registry("interleaved", _interleaved_rounds_of_p)),
    "zb-h1 B computes the weight gradients too": Planted(
        "a5_2_6", "B runs the whole backward (weights included, graph kept): W adds the weight gradients again",
        ("pipeline.stage_runner:StageRunner.compute_input_grad",), _input_grad_with_weights),
    "zb-h1 deferrals counted from the last rank": Planted(
        "a5_2_6", "rank r defers p - 1 - r weight gradients instead of r",
        ("pipeline.schedules:zb_h1_actions", "pipeline:zb_h1_actions", "tests.pipeline.test_zero_bubble:zb_h1_actions"),
        _zb_h1_defers_p_minus_rank),
    "f's backward all-reduce over the world": Planted(
        "a5_3_1", "f's backward all-reduces in the world (ctx.group not passed)",
        ("tensor_parallel.mappings:CopyToTensorParallelRegion.backward",), _static(_f_backward_in_the_world)),
    "chunks split by the global rank": Planted(
        "a5_3_1", "split_along_dim keeps chunk dist.get_rank() instead of the rank in the group",
        ("tensor_parallel.mappings:split_along_dim",), _split_by_global_rank),
    "g's sum in float32": Planted(
        "a5_3_1", "g's all-reduce of x.float(), never cast back (a float64 or bf16 input comes out float32)",
        ("tensor_parallel.mappings:ReduceFromTensorParallelRegion.forward",), _static(_g_forward_in_float32)),
    "column layer's f without the group": Planted(
        "a5_3_2", "ColumnParallelLinear calls f without its group: the input gradient summed over the world",
        ("tensor_parallel.layers:ColumnParallelLinear.forward",), _column_forward_without_group),
    "row layer's g without the group": Planted(
        "a5_3_2", "RowParallelLinear calls g without its group: the partial sums added over the world",
        ("tensor_parallel.layers:RowParallelLinear.forward",), _row_forward_without_group),
    "vocab embedding reduced over the world": Planted(
        "a5_3_3", "VocabParallelEmbedding's partial embeddings summed over the world",
        ("tensor_parallel.vocab:VocabParallelEmbedding.forward",), _vocab_embedding_in_the_world),
    "vocab cross-entropy's sums over the world": Planted(
        "a5_3_3", "the cross-entropy's max and sums all-reduced over the world",
        ("tensor_parallel.vocab:VocabParallelCrossEntropy.forward",), _static(_vocab_cross_entropy_in_the_world)),
    "tp head's f without the group": Planted(
        "a5_3_4", "TensorParallelGPT2's head calls f without its group",
        ("tensor_parallel.gpt2:copy_to_tensor_parallel_region",), _head_copy_without_group),
    "sequence gather over the world": Planted(
        "a5_3_5", "the sequence-parallel all-gather over the world (ctx.group not passed)",
        ("tensor_parallel.mappings:GatherFromSequenceParallelRegion.forward",), _static(_sequence_gather_in_the_world)),
    "partial grads synced over the world": Planted(
        "a5_3_5", "sync_partial_grads all-reduces the layer norms' partial gradients over the world",
        ("tensor_parallel.sequence_parallel:sync_partial_grads", "tensor_parallel.gpt2:sync_partial_grads"),
        _partial_grads_synced_in_the_world),
    "ring chunks floored, the remainder dropped": Planted(
        "a5_4_1", "p chunks of numel // p: the last numel % p elements never reduced",
        ("communication.ring:ring_all_reduce", "communication:ring_all_reduce"), _ring(chunking="floor")),
    "ring sends before it receives": Planted(
        "a5_4_1", "each step an isend to the right, then a recv from the left (not one batch): under NCCL two "
        "ranks that each send first wait for each other",
        ("communication.ring:ring_all_reduce", "communication:ring_all_reduce"), _ring(paired=False)),
    "ring messages in float32": Planted(
        "a5_4_1", "every message cast to float32 (and back): right sizes, the wrong dtype for float64 and int64",
        ("communication.ring:ring_all_reduce", "communication:ring_all_reduce"), _ring(wire_dtype=torch.float32)),
    "ring peers addressed by their rank in the group": Planted(
        "a5_4_1", "right and left neighbours (r ± 1) % p used as global ranks (right only while the group is the "
        "world or starts at rank 0)", ("communication.ring:ring_all_reduce", "communication:ring_all_reduce"),
        _ring(peers_by_group_rank=True)),
    "bucket closed at its capacity": Planted(
        "a5_4_2", "a bucket closed when the next parameter would fill it exactly (>= instead of >)",
        ("communication.buckets:bucket_parameters",), _bucket_parameters(close_at_capacity=True)),
    "last bucket dropped": Planted(
        "a5_4_2", "the last, partly filled bucket never appended", ("communication.buckets:bucket_parameters",),
        _bucket_parameters(drop_last=True)),
    "buckets launched as they fill": Planted(
        "a5_4_2", "each bucket's all-reduce started when it fills, not in bucket order",
        ("communication.buckets:BucketedReducer.grad_ready", "communication.buckets:BucketedReducer.finish"),
        _buckets_launched_when_full_and_finished),
    "buckets averaged over the ranks that used them": Planted(
        "a5_4_2", "each gradient divided by the number of ranks that had it, not the group's size",
        ("communication.buckets:BucketedReducer.finish",), _finish(over_users=True)),
    "top-k values sent in float32": Planted(
        "a5_4_3", "the k values cast to float32 (whatever the gradient's dtype)",
        ("communication.compression:topk_compress",), _topk_compress(values_dtype=torch.float32)),
    "top-k residual in the default dtype": Planted(
        "a5_4_3", "the new residual a fresh torch.zeros (the default dtype) filled from grad + residual",
        ("communication.compression:topk_compress",), _topk_compress(residual_default_dtype=True)),
    "mesh coordinates with dp fastest": Planted(
        "a5_6_1", "dp varies fastest and tp second (rank = (pp * tp + tp_rank) * dp + dp_rank)",
        ("three_d.mesh_arithmetic:coordinates", "three_d:coordinates",
         "tests.three_d.test_mesh_arithmetic:coordinates"),
        _coordinates_dp_fastest),
    "tp group counted from the rank": Planted(
        "a5_6_1", "the tp group as ranks rank .. rank + tp - 1: the group's lower members left out",
        ("three_d.mesh_arithmetic:group_ranks", "three_d:group_ranks",
         "tests.three_d.test_mesh_arithmetic:group_ranks"),
        _tp_group_from_the_rank),
    "3d head's f without the group": Planted(
        "a5_6_2", "the last stage's f called without the stage's tp group",
        ("three_d.stage:TensorParallelStage.forward",), _stage_head_copy_without_group),
    "3d gradients averaged by the world's size": Planted(
        "a5_6_3", "the dp all-reduce divided by the world's size", ("three_d.step:average_over_dp",),
        _dp_average_over_the_world),
    "3d norm counts replicated parameters on every tp rank": Planted(
        "a5_6_3", "every tp rank adds the squares of the replicated parameters", ("three_d.step:global_grad_norm",),
        _grad_norm(every_tp_rank=True)),
    "3d norm not summed over the pipeline": Planted(
        "a5_6_3", "the squares summed over the tp group only: each stage clips by its own norm",
        ("three_d.step:global_grad_norm",), _grad_norm(skip_pp=True)),
    "online update in the inputs' dtype": Planted(
        "a5_7_1", "the scores q k^T and p v computed in the inputs' dtype (bf16), only then widened",
        ("context_parallel.online_softmax:online_softmax_update", "context_parallel:online_softmax_update",
         "context_parallel.blockwise_attention:online_softmax_update"), _online_update_in_the_inputs_dtype),
    "block gradients in the inputs' dtype": Planted(
        "a5_7_1", "a block's gradients computed in the inputs' dtype (bf16), not the statistics' (float32)",
        ("context_parallel.online_softmax:block_gradients", "context_parallel:block_gradients",
         "context_parallel.blockwise_attention:block_gradients"), _block_gradients_in_the_inputs_dtype),
    "causal tile skipped at the diagonal": Planted(
        "a5_7_1", "a tile skipped when its first key is at the last query's position (>= instead of >)",
        ("context_parallel.online_softmax:causal_block", "context_parallel:causal_block",
         "context_parallel.blockwise_attention:causal_block"), _causal_block_off_by_one),
    "ring attention receives into a float32 buffer": Planted(
        "a5_7_2", "the incoming K/V block's buffer made with torch.empty(shape): the default dtype, not the block's",
        ("context_parallel.ring_attention:RingAttention.forward",), _ring_forward(buffer_default_dtype=True)),
    "zig-zag second chunk from the middle": Planted(
        "a5_7_2", "zig-zag rank r holds chunks r and cp + r instead of r and 2 cp - 1 - r",
        ("context_parallel.layouts:chunk_ids", "context_parallel:chunk_ids"), _zigzag_pairs_from_the_middle),
    "ulysses output all-to-all over the world": Planted(
        "a5_7_3", "the output's all-to-all back to sequence shards over the world, not the cp group",
        ("context_parallel.ulysses:HeadsToSequence.forward",), _static(_ulysses_heads_to_sequence_in_the_world)),
}


# Correct solutions written otherwise than the reference: the key's tests must pass on each (a test that fails on one
# checks the text of the reference, not what it does). Planted like the wrong ones, by tests/instructor/test_planted.py.
ALTERNATIVES: dict[str, Planted] = {
    "divergences by per-pair queues": Planted(
        "a5_4_4", "collectives walked seq by seq per group; each pair's sends and receives popped from two queues",
        ("communication.hang_lab:first_divergences",), _divergences_by_queues),
    "divergences by two sorted passes": Planted(
        "a5_4_4", "collectives sorted by (group, seq, rank); messages numbered per pair and op, then sorted",
        ("communication.hang_lab:first_divergences",), _divergences_by_sorting),
    "zeropp one message of values and scales": Planted(
        "a5_5_5", "qwZ's all-gather and qgZ's all-to-all each send the int8 values and the fp32 scales' bytes in one "
                  "message (the same bytes, half the calls)",
        ("memory.zeropp:quantized_all_gather", "memory.zeropp:quantized_reduce_scatter"), _one_message),
    "deepseek bias update on load fractions": Planted(
        "a5_8_4", "the bias moved by the sign of each expert's share of the load against the mean share",
        ("moe.deepseek_router:updated_bias",), _bias_update_on_load_fractions),
}


@contextlib.contextmanager
def plant(name: str):
    """Replace the targets of :data:`PLANTED` ``[name]`` (or :data:`ALTERNATIVES` ``[name]``) in this process for the
    block, then restore them.

    Raises:
        KeyError: no planted solution of that name.
    """
    planted = PLANTED[name] if name in PLANTED else ALTERNATIVES[name]
    with contextlib.ExitStack() as stack:
        for target in planted.targets:
            module, _, path = target.partition(":")
            owner = importlib.import_module(module)
            *parents, attribute = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            original = owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
            stack.enter_context(mock.patch.object(owner, attribute, planted.make(original)))
        yield
