"""Instructor tools: the table of assignment keys, the student release, the grader, the grading-integrity check."""
