"""Bad input to the context-parallel part is refused with a message that says what to change, before
any work or any process starts (scaffolding around the assignments: these pass on the release too)."""
import pytest
import torch


def test_blockwise_attention_refuses_bad_shapes_and_block_size():
    from context_parallel import blockwise_attention

    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="block_size"):
        blockwise_attention(q, q, q, causal=True, block_size=0)
    with pytest.raises(ValueError, match="batch, heads, seq, head_dim"):
        blockwise_attention(q[0], q[0], q[0], causal=False)


def test_layout_refuses_lengths_it_cannot_cut():
    from context_parallel import SequenceLayout

    with pytest.raises(ValueError, match=r"not divisible by 8; pad the sequences to a multiple of 8 \(e.g. 40\)"):
        SequenceLayout("zigzag", 4, 36)
    with pytest.raises(ValueError, match="unknown layout"):
        SequenceLayout("striped", 2, 8)


def test_ring_attention_refuses_a_layout_for_another_group():
    from context_parallel import SequenceLayout, ring_attention

    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="cp = 2 ranks, the group has 1"):
        ring_attention(q, q, q, layout=SequenceLayout("zigzag", 2, 16), causal=True)


def test_ring_attention_refuses_values_of_another_width():
    from context_parallel import ring_attention

    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="v must be as wide as q and k"):
        ring_attention(q, q, torch.randn(1, 2, 8, 6), causal=True)


def test_ulysses_attention_refuses_a_layout_for_another_group():
    from context_parallel import SequenceLayout, ulysses_attention

    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="cp = 2 ranks, the group has 1"):
        ulysses_attention(q, q, q, layout=SequenceLayout("contiguous", 2, 16), causal=True)
    with pytest.raises(ValueError, match="each rank holds 4 of the 4 positions, but q has 8"):
        ulysses_attention(q, q, q, layout=SequenceLayout("contiguous", 1, 4), causal=True)


def test_attention_functions_share_one_signature():
    """docs/architecture.md, "The parallel functions' API": q, k, v, then keywords in one order with one
    set of defaults; ``causal`` has no default (so no call changes meaning silently), and a positional
    argument after v is refused."""
    import inspect

    from context_parallel import blockwise_attention, ring_attention, ulysses_attention

    order = ["q", "k", "v", "group", "layout", "causal", "scale", "block_size"]
    params = {}
    for fn in (blockwise_attention, ring_attention, ulysses_attention):
        sig = inspect.signature(fn).parameters
        assert [n for n in sig if n in order] == [n for n in order if n in sig], fn.__name__
        assert all(sig[n].kind is inspect.Parameter.KEYWORD_ONLY for n in sig if n not in ("q", "k", "v"))
        assert sig["causal"].default is inspect.Parameter.empty, fn.__name__
        for name, p in sig.items():
            params.setdefault(name, set()).add(p.default)
    assert all(len(defaults) == 1 for defaults in params.values()), params
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(TypeError):
        blockwise_attention(q, q, q, True)


def test_check_heads_names_the_choices():
    from context_parallel import check_heads

    check_heads(12, 4)
    with pytest.raises(ValueError, match=r"12 heads are not divisible by 5; choose cp in \[1, 2, 3, 4, 6, 12\]"):
        check_heads(12, 5)


def _parse(argv, tmp_path):
    from project.run_context_parallel import parse_args

    return parse_args([*argv, "--workdir", str(tmp_path), "--device", "cpu", "--preset", "tiny"])


@pytest.mark.parametrize("argv,message", [
    (["--cp", "3", "--attention", "ulysses", "--seq_len", "384"], "--cp 3: Ulysses gives each of the cp = 3 ranks"),
    (["--cp", "4", "--seq_len", "1020"], "--seq_len 1020 must be divisible by 8 (the zigzag layout"),
    (["--cp", "4", "--seq_len", "1022", "--layout", "contiguous"], "--seq_len 1022 must be divisible by 4"),
    (["--cp", "2", "--attention", "ulysses", "--layout", "zigzag"], "Ulysses always uses the contiguous layout"),
    (["--cp", "2", "--seq_len", "64"], "--seq_len 64 is shorter than one pair may be"),
    (["--cp", "2", "--dp", "2", "--batch_size", "3"], "--batch_size 3 is not divisible by --dp 2"),
    (["--cp", "0"], "--cp must be a whole number >= 1"),
])
def test_run_script_refuses_bad_options_before_starting(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        _parse(argv, tmp_path)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_run_script_defaults(tmp_path):
    args = _parse(["--cp", "2"], tmp_path)
    assert (args.cp, args.dp, args.attention, args.layout, args.seq_len) == (2, 1, "ring", "zigzag", 1024)
    args = _parse(["--cp", "2", "--attention", "ulysses"], tmp_path)
    assert args.layout == "contiguous"
