"""No reference solution within reach of a key, and none in what the student is shown.

* A key's grading copy holds the reference of only the keys it depends on; every other block is its stub.
* Feedback that quotes a line of reference code — as written or encoded — is withheld and listed for
  review (instructor/leaks.py). Tried end to end with the block policy switched off (so that the walls
  behind it are what is tested): a5_2_2's block (a5_2_2 depends on a5_2_1) reads its package's source
  files and raises an AssertionError carrying them, a different encoding in every test.
"""
from __future__ import annotations

import base64
import bz2
import codecs
import gzip
import json
import lzma
import textwrap
import zlib
from pathlib import Path

import pytest

from instructor.blocks import course_files, find_blocks
from instructor.grade import WITHHELD, grade_key
from instructor.keys import KEYS, requirements
from instructor.leaks import ReferenceLines
from instructor.release import make_release
from instructor.submission import grading_tree, marker_files

REPO = Path(__file__).resolve().parents[2]


def encodings(text: str) -> dict[str, str]:
    """The encodings of ``text`` a hostile block tries (each must be caught)."""
    data = text.encode()
    return {
        "plain": text,
        "repr": repr(text),
        "reversed": text[::-1],
        "rot13": codecs.encode(text, "rot13"),
        "base64": base64.b64encode(data).decode(),
        "urlsafe base64": base64.urlsafe_b64encode(data).decode(),
        "base32": base64.b32encode(data).decode(),
        "base85": base64.b85encode(data).decode(),
        "hex": data.hex(),
        "hex with spaces": data.hex(" "),
        "zlib + base64": base64.b64encode(zlib.compress(data)).decode(),
        "gzip + hex": gzip.compress(data).hex(),
        "bz2 + base64": base64.b64encode(bz2.compress(data)).decode(),
        "lzma + base85": base64.b85encode(lzma.compress(data)).decode(),
        "reversed base64": base64.b64encode(data).decode()[::-1],
        "character codes": str([ord(c) for c in text]),
    }


@pytest.fixture(scope="module")
def references() -> ReferenceLines:
    return ReferenceLines.of_tree(REPO)


def block_code(key: str) -> str:
    path = REPO / marker_files(REPO, key)[0]
    lines = path.read_text().split("\n")
    block = [b for b in find_blocks(lines, str(path)) if b.marker == KEYS[key].marker][0]
    return "\n".join(lines[block.begin + 1:block.end])


@pytest.mark.parametrize("how", sorted(encodings("x")))
def test_reference_code_is_found_however_it_is_encoded(references, how):
    source = (REPO / "pipeline" / "clock_cycles.py").read_text()  # holds 5.2.1's reference
    message = f"AssertionError: look at this\n{encodings(source)[how]}\nend of message"
    found = references.found_in(message)
    assert found is not None, f"{how}: not found"


def test_ordinary_feedback_and_the_students_own_code_are_not_withheld(references):
    stub = ("NotImplementedError: Assignment 5.2.1: implement _clock_cycles (clock-cycle schedule). See "
            "notebooks/02_pipeline_parallel.ipynb; check with: pytest -k a5_2_1")
    tensors = "AssertionError: Tensor-likes are not close!\nMismatched elements: 3 / 12 (25.0%)\n" \
              "Greatest absolute difference: 0.0123 at index (0, 1) (up to 1e-05 allowed)"
    for text in (stub, tensors, "rank 1 raised RuntimeError: Connection closed by peer [127.0.0.1]:59627"):
        assert references.found_in(text) is None, text
    own = block_code("a5_2_1")  # the student wrote exactly the reference: their own lines are theirs
    assert references.found_in(own) is not None
    assert ReferenceLines.of_tree(REPO, own_code=own).found_in(own) is None


def test_a_keys_grading_copy_holds_only_the_reference_it_depends_on(tmp_path):
    key = "a5_2_3"
    spliced = grading_tree(REPO, REPO, key, tmp_path / "tree")
    keep = {key} | requirements(key)
    assert keep == {"a5_2_1", "a5_2_2", "a5_2_3"}
    for name in course_files(REPO):
        if not name.endswith(".py") or not (spliced.root / name).is_file():
            continue
        lines = (spliced.root / name).read_text().split("\n")
        for block in find_blocks(lines, name):
            body = [line.strip() for line in lines[block.begin + 1:block.end] if line.strip()]
            stub = len(body) == 1 and body[0].startswith("raise NotImplementedError(")
            kept = block.marker.replace("ASSIGN", "a") in keep
            assert stub != kept, f"{name}:{block.begin + 1} {block.marker}: {'a stub' if stub else 'reference'}"
    assert not (spliced.root / "tests" / "instructor").exists(), "instructor-only files stay out of the copy"
    assert not (spliced.root / "instructor" / "release.py").exists()


@pytest.mark.timeout(600)
def test_a_block_that_raises_its_packages_source_shows_none_of_it(tmp_path):
    side = tmp_path / "seen.json"
    attack = f'''
        import base64, bz2, codecs, gzip, json, lzma, zlib
        from pathlib import Path
        root = Path(__file__).resolve().parents[1]
        files = {{str(p.relative_to(root)): p.read_text() for d in ("pipeline", "data_parallel", "tensor_parallel")
                 for p in sorted((root / d).glob("*.py"))}}
        Path({str(side)!r}).write_text(json.dumps(files))
        text = files["pipeline/clock_cycles.py"] + files["pipeline/partition.py"]
        data = text.encode()
        forms = [text, repr(text), text[::-1], codecs.encode(text, "rot13"), base64.b64encode(data).decode(),
                 data.hex(), base64.b64encode(zlib.compress(data)).decode(), gzip.compress(data).hex(),
                 base64.b85encode(lzma.compress(data)).decode(), base64.b32encode(data).decode(),
                 base64.b64encode(bz2.compress(data)).decode(), str([ord(c) for c in text])]
        Pipe.calls = getattr(Pipe, "calls", -1) + 1
        raise AssertionError("the package's files:\\n" + forms[Pipe.calls % len(forms)])
    '''
    submission = tmp_path / "submission"  # the student release, with the attack as 5.2.2's code
    make_release(REPO, submission)
    path = submission / "pipeline" / "pipe.py"
    lines = path.read_text().split("\n")
    block = [b for b in find_blocks(lines, str(path)) if b.marker == "ASSIGN5_2_2"][0]
    lines[block.begin + 1:block.end] = [block.indent + line for line in textwrap.dedent(attack).strip().split("\n")]
    path.write_text("\n".join(lines))
    result = grade_key("a5_2_2", submission=submission, enforce_policy=False, timeout=300)
    assert result.points == 0

    # the copy held 5.2.1's reference (5.2.2 depends on it) and stubs for every other key
    seen = json.loads(side.read_text())
    assert "for k in range(m + n - 1):" in seen["pipeline/clock_cycles.py"]
    for name, text in seen.items():
        for b in find_blocks(text.split("\n"), name):
            body = [line.strip() for line in text.split("\n")[b.begin + 1:b.end] if line.strip()]
            if b.marker not in ("ASSIGN5_2_1", "ASSIGN5_2_2"):
                assert len(body) == 1 and body[0].startswith("raise NotImplementedError("), (name, b.marker)

    # and the student saw none of it
    shown = result.output + "".join(f.message for f in result.failures)
    assert WITHHELD in shown
    secret = (REPO / "pipeline" / "clock_cycles.py").read_text() + (REPO / "pipeline" / "partition.py").read_text()
    for how, form in encodings(secret).items():
        chunks = {form[i:i + 40] for i in range(0, max(1, len(form) - 40), 40)}
        assert not any(chunk in shown for chunk in chunks), f"{how} of the reference reached the student"
    for line in block_code("a5_2_1").split("\n"):
        assert line.strip() not in shown
    assert any("withheld" in note for note in result.review), result.review
    side.unlink()

    # with the block policy on (as the grader runs), the same block is refused before any of it runs
    refused = grade_key("a5_2_2", submission=submission, timeout=300)
    assert refused.points == 0 and "breaks the block policy" in refused.output, refused.output
    assert "rule 'import'" in refused.output and not side.exists(), "the refused block ran"
    assert not any(line.strip() in refused.output for line in block_code("a5_2_1").split("\n") if line.strip())
