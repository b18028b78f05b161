"""``project/run_moe.py``: bad options stop with a message before any process starts, and a short run
trains from one command to a BLEU and a loss on Multi30k (ungraded; the run needs the solutions)."""
from __future__ import annotations

import json
import math

import pytest


@pytest.mark.parametrize("argv,message", [
    (["--dp", "4", "--ep", "4", "--num_experts", "6"], "--num_experts 6 is not divisible by --ep 4"),
    (["--num_experts", "4", "--top_k", "5"], "--top_k must be between 1 and --num_experts 4"),
    (["--top_k", "0"], "--top_k must be between 1"),
    (["--capacity_factor", "0"], "--capacity_factor must be > 0"),
    (["--capacity_factor", "-1.5"], "--capacity_factor must be > 0"),
    (["--dp", "2", "--ep", "3"], "--ep 3 does not divide dp x cp"),
    (["--num_experts", "0"], "--num_experts must be a whole number >= 1"),
    (["--dp", "2", "--batch_size", "7"], "--batch_size 7 is not divisible by --dp 2"),
    (["--aux_loss_coef", "-0.1"], "--aux_loss_coef must be >= 0"),
    (["--moe_every", "5"], "none would be an MoE block"),
    (["--router_bias_update", "0.001"], "--router_bias_update belongs to the DeepSeek router: add --router deepseek"),
    (["--router", "deepseek", "--n_group", "3"], "--n_group must divide --num_experts 4"),
    (["--router", "deepseek", "--n_group", "2", "--topk_group", "3"], "--topk_group must be between 1 and --n_group 2"),
    (["--router", "deepseek", "--num_experts", "8", "--top_k", "4", "--n_group", "4"], "hold fewer than --top_k 4"),
    (["--shared_experts", "-1"], "--shared_experts must be a whole number >= 0"),
    (["--routed_scaling_factor", "2.5"], "--routed_scaling_factor belongs to the DeepSeek router"),
    (["--router", "deepseek", "--routed_scaling_factor", "0"], "--routed_scaling_factor must be > 0"),
])
def test_bad_options_stop_before_any_process_starts(tmp_path, capsys, monkeypatch, argv, message):
    import project.run_moe as run_moe
    import project.train

    monkeypatch.setattr(project.train, "launch", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(SystemExit) as exit_info:
        run_moe.main(argv + ["--workdir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_config_errors_name_the_option():
    from moe.config import MoEConfig

    with pytest.raises(ValueError, match="--top_k must be between 1 and --num_experts 2"):
        MoEConfig(num_experts=2, top_k=3)
    with pytest.raises(ValueError, match="--capacity_factor must be > 0"):
        MoEConfig(capacity_factor=float("nan"))
    with pytest.raises(ValueError, match="not divisible by --ep 3"):
        MoEConfig(num_experts=4).check(3)
    assert MoEConfig(top_k=1).normalize_gates is False and MoEConfig(top_k=2).normalize_gates is True


@pytest.mark.needs_solution
@pytest.mark.timeout(400)
def test_one_command_trains_to_a_loss_and_a_bleu(tmp_path):
    from project.run_moe import main

    argv = ["--dp", "2", "--ep", "2", "--num_experts", "4", "--top_k", "2", "--capacity_factor", "1.25",
            "--batch_size", "8", "--max_batches", "3", "--n_bleu", "4", "--max_val_batches", "1",
            "--vocab_size", "1000", "--workdir", str(tmp_path), "--quiet", "--timeout", "300"]
    assert main(argv) == 0
    for rank in (0, 1):
        r = json.loads((tmp_path / f"moe_rank{rank}_results_epoch0.json").read_text())
        for key in ("validation_loss", "bleu", "training_time", "tokens_per_sec"):
            assert math.isfinite(r[key]), f"rank {rank}: {key} = {r[key]}"
        assert r["steps"] == 3 and len(r["routing"]["tokens_per_expert"]) == 3
        assert r["config"]["ep"] == 2 and r["config"]["capacity_factor"] == 1.25
        assert r["comm_per_step"]["ep"]["all_to_all"]["count"] > 0
    assert (tmp_path / "moe_translations_epoch0.json").is_file()


def test_group_none_is_the_world_and_sharded_experts_name_the_group():
    """``group=None`` means the world in every part (docs/architecture.md, "The parallel functions' API"):
    in one process that is a group of one rank, so every expert must be here, and half of them is refused
    with a message naming the group and what to pass."""
    import torch

    from moe.config import MoEConfig
    from moe.experts import MLPExperts
    from moe.layer import MoELayer

    experts = MLPExperts(4, 8, 16, generator=torch.Generator().manual_seed(0))
    assert MoELayer(8, MoEConfig(4, 2), experts).ep == 1
    with pytest.raises(ValueError, match=r"over the 1 ranks of the world \(group=None\) means 4 each; pass the"):
        MoELayer(8, MoEConfig(4, 2), experts.shard(0, 2))
