"""The memory options of project/run_data_parallel.py are checked before any process starts
(ungraded)."""
import pytest

from project.run_data_parallel import parse_args


def test_zero_stage_must_be_0_to_3(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--zero", "4", "--workdir", str(tmp_path)])
    assert "--zero" in capsys.readouterr().err


def test_sharded_runs_write_checkpoints_and_hsdp_needs_zero3_and_a_divisor_of_dp(tmp_path, capsys):
    assert parse_args(["--zero", "2", "--checkpoint_every", "5", "--workdir", str(tmp_path)]).zero == 2
    assert parse_args(["--dp", "4", "--zero", "3", "--hsdp", "2", "--workdir", str(tmp_path)]).hsdp == 2
    for argv, message in ((["--dp", "4", "--zero", "2", "--hsdp", "2"], "also give --zero 3"),
                          (["--dp", "4", "--zero", "3", "--hsdp", "3"], "--hsdp 3 must be a number of replicas that "
                                                                         "divides --dp 4")):
        with pytest.raises(SystemExit):
            parse_args([*argv, "--workdir", str(tmp_path)])
        assert message in capsys.readouterr().err


def test_zeropp_names_its_parts_needs_zero3_and_a_group_that_divides_dp(tmp_path, capsys):
    from memory.zeropp import OPTIONS
    from project.options.run_data_parallel import ZEROPP

    assert ZEROPP == OPTIONS, "the torch-free configuration names ZeRO++'s parts as memory.zeropp does"
    args = parse_args(["--dp", "4", "--zero", "3", "--zeropp", "qwz,hpz,qgz", "--zeropp_group", "2",
                       "--workdir", str(tmp_path)])
    assert (args.zeropp_options(), args.hpz_group_size()) == (("qwz", "hpz", "qgz"), 2)
    for argv, message in ((["--zero", "2", "--zeropp", "qwz"], "also give --zero 3"),
                          (["--zero", "3", "--zeropp", "qwz,int4"], "unknown int4"),
                          (["--dp", "4", "--zero", "3", "--hsdp", "2", "--zeropp", "hpz"], "drop one of them"),
                          (["--dp", "4", "--zero", "3", "--zeropp", "hpz", "--zeropp_group", "3"],
                           "--zeropp_group 3 must divide --dp 4")):
        with pytest.raises(SystemExit):
            parse_args([*argv, "--workdir", str(tmp_path)])
        assert message in capsys.readouterr().err


def test_precision_choices(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--precision", "fp16", "--workdir", str(tmp_path)])
    assert "--precision" in capsys.readouterr().err


def test_defaults_are_plain_data_parallelism(tmp_path):
    args = parse_args(["--workdir", str(tmp_path)])
    assert (args.zero, args.activation_checkpointing, args.precision) == (0, False, "fp32")


def test_bf16_autocasts_compute_and_keeps_fp32_weights_and_gradients():
    import torch

    from memory.training import ShardedStep
    from tests.support.memory import batch, lm_loss, make_model

    ids = batch(0, 2)
    data = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    losses = {}
    for precision in ("fp32", "bf16"):
        model = make_model()
        seen = []
        model.blocks[0].up.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        step = ShardedStep(model, 0, None, torch.optim.Adam, precision=precision, lr=1e-3)
        losses[precision] = float(step.forward_backward(data, "cpu", lambda m, b: lm_loss(m, b["input_ids"])))
        assert seen == [torch.bfloat16 if precision == "bf16" else torch.float32]
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    assert abs(losses["bf16"] - losses["fp32"]) < 0.02 * losses["fp32"]
