"""The grader's pytest plugin: the only source of a key's results (``pytest -p instructor.grading_plugin``).

The grader (``instructor/grade.py``) starts pytest with this plugin and two environment
variables, which the plugin takes out of the environment as soon as it loads — before any
test or student code runs:

* ``LLMSYS_GRADE_RECORD`` — a file outside the grading copy, where the plugin writes one
  JSON object per line: ``start``, one ``test`` per test (its outcome derived from the
  exceptions pytest caught in setup, call and teardown, the full exception text and the
  traceback's file/line pairs), and ``finish`` (the collected tests and any tampering seen);
* ``LLMSYS_GRADE_NONCE`` — a random token every line carries.

A pytest process that ends without a ``finish`` line carrying the nonce (``os._exit``, a kill,
a crash) scores zero; nothing pytest prints is read, so a forged summary line counts for
nothing. At the end the plugin checks that the pytest internals that decide outcomes are the
ones it saw at load time (a submission that patches ``TestReport`` or ``CallInfo`` is reported
as tampering), and that no function or class the tests lean on was replaced: every public
callable of ``torch``, ``torch.Tensor``, ``torch.nn.Module``, ``torch.distributed``,
``torch.nn.functional``, ``torch.testing``, ``math``, ``builtins``, ``pytest`` and pytest's
runner, fixtures and outcomes is the object it was when the session started (tests that
monkeypatch put things back before the session ends; a wrapper whose ``__wrapped__`` is the original,
as torch puts on some of its functions when a submodule loads, is the same function). The threat
model is in docs/grading.md.
"""
from __future__ import annotations

import json
import os
import re

import pytest
from _pytest import reports, runner

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_STATE: dict = {}
_GONE = object()


def _internals() -> dict:
    return {"CallInfo.from_call": runner.CallInfo.__dict__.get("from_call"),
            "call_and_report": runner.call_and_report,
            "TestReport.__init__": reports.TestReport.__init__,
            "TestReport.from_item_and_call": reports.TestReport.__dict__.get("from_item_and_call"),
            "TestReport.outcome": reports.TestReport.__dict__.get("outcome")}


def _watched() -> dict:
    """``{"module.name": (namespace, name, object)}`` of every public callable the tests lean on."""
    import builtins
    import math

    from _pytest import fixtures, outcomes, python

    spaces = {"builtins": builtins, "math": math, "pytest": pytest, "_pytest.runner": runner,
              "_pytest.reports": reports, "_pytest.python": python, "_pytest.fixtures": fixtures,
              "_pytest.outcomes": outcomes}
    try:
        import torch
        import torch.distributed
        import torch.nn.functional
        import torch.testing

        spaces.update({"torch": torch, "torch.Tensor": torch.Tensor, "torch.nn.Module": torch.nn.Module,
                       "torch.distributed": torch.distributed, "torch.nn.functional": torch.nn.functional,
                       "torch.testing": torch.testing})
    except ImportError:
        pass
    found = {}
    for label, space in spaces.items():
        for name, value in list(vars(space).items()):
            if not name.startswith("_") or (name.startswith("__") and label in ("torch.Tensor", "torch.nn.Module")):
                if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
                    found[f"{label}.{name}"] = (space, name, value)
    return found


def _unwrapped(value):
    """``value`` without the wrappers torch puts on its own functions when a submodule loads lazily
    (``torch._dynamo`` wraps ``torch.manual_seed``; the wrapper's ``__wrapped__`` is the original)."""
    import inspect

    try:
        return inspect.unwrap(value) if callable(value) else value
    except ValueError:  # a cycle of __wrapped__
        return value


def _write(event: dict) -> None:
    handle = _STATE.get("handle")
    if handle is not None:
        handle.write(json.dumps(dict(event, nonce=_STATE["nonce"])) + "\n")
        handle.flush()


def pytest_configure(config):
    path, nonce = os.environ.pop("LLMSYS_GRADE_RECORD", None), os.environ.pop("LLMSYS_GRADE_NONCE", None)
    if not path or not nonce:
        return
    _STATE.update(nonce=nonce, handle=open(path, "a", encoding="utf-8"), internals=_internals(), tests={},
                  watched=_watched())
    _write({"event": "start", "pid": os.getpid()})


def _message(excinfo) -> str:
    """The exception's text; for a failure reported from another process (the launcher's
    ``RankFailure``) its first line and the inner exception's last lines."""
    text = excinfo.exconly()
    if "Traceback (most recent call last)" not in text:
        return text
    head = text.split("\n", 1)[0]
    lines = text.rstrip().split("\n")
    last_frame = max((i for i, line in enumerate(lines) if line.startswith("  ")), default=0)
    return head + "\n" + "\n".join(lines[last_frame + 1:])


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if "nonce" not in _STATE:
        return
    entry = _STATE["tests"].setdefault(item.nodeid, {"failed": False, "skipped": False, "message": "",
                                                     "frames": [], "longrepr": "", "when": ""})
    if call.excinfo is None:
        return
    if call.excinfo.errisinstance(pytest.skip.Exception):
        entry["skipped"] = True
        entry["message"] = entry["message"] or f"skipped: {call.excinfo.exconly()}"
        return
    if entry["failed"]:
        return  # keep the first failure (setup before call before teardown)
    entry.update(failed=True, when=call.when, message=_message(call.excinfo))
    frames = [(str(e.path), e.lineno + 1) for e in call.excinfo.traceback]
    frames += [(p, int(n)) for p, n in _FRAME.findall(call.excinfo.exconly())]
    entry["frames"] = frames
    try:
        report = outcome.get_result()
        entry["longrepr"] = str(report.longrepr)
    except Exception:  # noqa: BLE001 - the outcome above is what counts
        entry["longrepr"] = entry["message"]


def pytest_collectreport(report):
    if "nonce" in _STATE and report.failed:
        _STATE["tests"][f"{report.nodeid}::<collection>"] = {
            "failed": True, "skipped": False, "when": "collect", "frames": [],
            "message": f"the tests could not be collected: {str(report.longrepr).strip().splitlines()[-1]}",
            "longrepr": str(report.longrepr)}


def pytest_collection_finish(session):
    if "nonce" in _STATE:
        _STATE["collected"] = [item.nodeid for item in session.items]
        _STATE["markers"] = {item.nodeid: sorted({m.name for m in item.iter_markers()}) for item in session.items}


def pytest_sessionfinish(session, exitstatus):
    if "nonce" not in _STATE:
        return
    now = _internals()
    tampered = [name for name, value in _STATE["internals"].items() if now[name] is not value]
    tampered += [label for label, (space, name, value) in _STATE["watched"].items()
                 if _unwrapped(vars(space).get(name, _GONE)) is not _unwrapped(value)]
    _write({"event": "finish", "exitstatus": int(exitstatus), "collected": _STATE.get("collected", []),
            "markers": _STATE.get("markers", {}),
            "tests": _STATE["tests"], "tampered": tampered})
    _STATE["handle"].close()
    _STATE["handle"] = None
