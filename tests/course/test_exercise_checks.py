"""course.exercise_checks.report: right within the tolerance, "not yet" with the hint otherwise, never an error."""
from course.exercise_checks import report


def test_report_says_right_or_not_yet_with_the_hint(capsys):
    assert report("x", 3.0000001, 3.0, "h")
    assert not report("x", 3.1, 3.0, "think again")
    assert not report("x", None, 3.0, "h") and not report("x", "three", 3.0, "h")
    assert report("x", 0.1, 0.1 + 1e-12, "h") and not report("x", 2, 1, "h", rel=0.4)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "x: right (3.0000001)" and out[1] == "x: not yet (3.1) — hint: think again"
