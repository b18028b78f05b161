"""communication.labs.checks: each exercise check accepts the right answer and refuses the plausible wrong ones."""
import pytest

from communication.labs import checks


def test_bus_bandwidth(capsys):
    assert checks.check_bus_bandwidth(256, 448)
    assert "right" in capsys.readouterr().out
    assert not checks.check_bus_bandwidth(256, 224)      # (p-1)/p: the reduce-scatter factor
    assert not checks.check_bus_bandwidth(256, 256)      # busbw taken for algbw
    assert not checks.check_bus_bandwidth(0.256, 0.448)  # MB/ms read as GB/s by a factor 1000
    assert "hint" in capsys.readouterr().out


def test_crossover():
    assert checks.check_crossover(2.2e6)
    assert not checks.check_crossover(8 * 10e-6 * 25e9)  # the p = 4 formula 8 alpha / beta
    assert not checks.check_crossover(10e-6 * 25e9)      # alpha / beta
    assert not checks.check_crossover("two megabytes")


def test_gpt2_allreduce():
    assert checks.check_gpt2_allreduce(9.7535)
    assert not checks.check_gpt2_allreduce(2 * 9.33)   # fp32 bytes
    assert not checks.check_gpt2_allreduce(9.33)       # latency term left out: 0.42 ms is 4 % of the answer
    assert not checks.check_gpt2_allreduce(10.375)     # bytes factor 2 instead of 2(p-1)/p


@pytest.mark.parametrize("alpha, bw, ok", [(20, 50, True), (120, 50, False), (20, 33.3, False), (20, 75, False)])
def test_two_point_fit(alpha, bw, ok):
    assert checks.check_two_point_fit(alpha, bw) is ok


def test_hidden_hang(capsys):
    assert checks.check_hidden_hang(1, 3, "all_reduce", "bleu")
    assert checks.check_hidden_hang(1, 3, "gloo:all_reduce", " BLEU ")
    assert not checks.check_hidden_hang(0, 3, "all_reduce", "bleu")       # the rank that waits, not the one missing
    assert not checks.check_hidden_hang(1, 2, "all_reduce", "bleu")       # a place in rank 1's list, not the seq
    assert not checks.check_hidden_hang(1, 3, "all_reduce", "tokens")     # the collective rank 0 waits in, not the extra
    assert not checks.check_hidden_hang(None, None, None, None)
    assert "hint" in capsys.readouterr().out


@pytest.mark.needs_solution  # the analysis is assignment 5.4.4's
def test_hidden_hang_answer_is_what_the_analysis_of_its_recorded_dumps_names():
    from communication.hang_lab import first_divergences
    from course.flight_recorder import load_records
    from tests.support.hang_fixtures import FOLDER

    (d,) = first_divergences(load_records(FOLDER / "mystery_metrics"))
    assert (d.ranks, d.seq, d.op) == ((1,), 3, "all_reduce")
    assert checks.check_hidden_hang(d.ranks[0], d.seq, d.op, "bleu")


def test_the_new_checks_of_notebooks_04_and_10():
    from communication.cost_model import LINKS, allreduce_bytes_factor, allreduce_steps, predict_allreduce

    assert checks.check_recursive_doubling_three(allreduce_steps("recursive_doubling", 3), 3.0)
    assert allreduce_steps("recursive_doubling", 3) == 3 and allreduce_bytes_factor("recursive_doubling", 3) == 3
    choice = checks.small_message_choice()
    for (name, link), picked in zip(LINKS.items(), choice):
        ring = predict_allreduce("ring", 2 ** 20, 8, checks.LL_ALPHA[name], link.beta)
        rd = predict_allreduce("recursive_doubling", 2 ** 20, 8, checks.LL_ALPHA[name], link.beta)
        assert picked == ("ring" if ring < rd else "recursive doubling")
    flipped = ("ring" if choice[0] != "ring" else "recursive doubling",) + choice[1:]
    assert checks.check_small_message_choice(list(choice)) and not checks.check_small_message_choice(flipped)
    assert checks.check_watchdog_abort(303) and not checks.check_watchdog_abort(300)
    assert checks.check_flight_recorder_buffer(3000)
    assert checks.check_debug_detail("a") and checks.check_debug_detail("(a) shapes") and not checks.check_debug_detail("b")
    t = checks.straggler_step([100, 100, 100, 160], 5)
    assert t == {"step_ms": 165, "wait_ms": [60, 60, 60, 0], "waiting_share": 180 / 660}
    assert checks.check_straggler_step(165, 60, 180 / 660) and not checks.check_straggler_step(105, 0, 0)
    assert checks.check_silent_divergence("bias", 1) and not checks.check_silent_divergence("weight", 1)
