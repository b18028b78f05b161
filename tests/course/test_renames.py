"""One name per idea (docs/architecture.md, "The parallel functions' API"): a count of micro-batches is
``micro_batches`` and a count of model chunks per rank ``virtual_stages`` in every function; the former
keywords keep working for one release with a ``DeprecationWarning`` naming the new one."""
import pytest


@pytest.mark.needs_solution  # the interleaved action list is assignment 5.2.5's
def test_old_keywords_still_work_with_a_warning_naming_the_new_one():
    from pipeline.metrics import bubble_fraction
    from pipeline.schedules import all_actions

    new = all_actions("interleaved", 2, micro_batches=4, virtual_stages=2)
    with pytest.warns(DeprecationWarning, match=r"all_actions\(n_micro=\.\.\.\) is deprecated .* pass micro_batches="):
        old = all_actions("interleaved", 2, n_micro=4, virtual_stages=2)
    assert old == new
    with pytest.warns(DeprecationWarning, match="pass virtual_stages="):
        assert all_actions("interleaved", 2, micro_batches=4, n_chunks=2) == new
    with pytest.warns(DeprecationWarning, match="pass micro_batches="):
        assert bubble_fraction(4, n_micro=8) == bubble_fraction(4, micro_batches=8)


def test_old_and_new_keyword_together_are_refused():
    from pipeline.schedules import gpipe_actions

    with pytest.raises(TypeError, match=r"got n_micro= and micro_batches=; pass micro_batches= only"):
        gpipe_actions(0, 2, micro_batches=2, n_micro=2)


def test_the_renamed_functions_show_the_new_names():
    import inspect

    from pipeline.gpt2_stages import gpt2_chunks
    from pipeline.schedules import schedule_actions
    from three_d.step import three_d_step

    assert "micro_batches" in inspect.signature(three_d_step).parameters
    assert list(inspect.signature(schedule_actions).parameters)[-2:] == ["micro_batches", "virtual_stages"]
    assert "virtual_stages" in inspect.signature(gpt2_chunks).parameters
