"""course/flight_recorder.py without processes: the environment variables, the checks made before a run starts,
reading dumps back, and torch.distributed put back as it was after recording. (Recorded runs:
tests/communication/test_hang_runs.py.)"""
from __future__ import annotations

import json

import pytest
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from course import flight_recorder as fr


def test_buffer_size_reads_the_new_name_then_the_old_one_then_torchs_default():
    assert fr.buffer_size({}) == 2000
    assert fr.buffer_size({"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}) == 50
    assert fr.buffer_size({"TORCH_FR_BUFFER_SIZE": "70", "TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}) == 70
    with pytest.raises(ValueError, match="whole number"):
        fr.buffer_size({"TORCH_FR_BUFFER_SIZE": "lots"})


def test_switch_on_sets_the_size_keeps_the_users_and_refuses_a_recorder_switched_off(monkeypatch):
    monkeypatch.delenv(fr.BUFFER_ENV, raising=False)
    monkeypatch.delenv(fr.LEGACY_BUFFER_ENV, raising=False)
    assert fr.switch_on(300) == 300
    monkeypatch.setenv(fr.BUFFER_ENV, "40")
    assert fr.switch_on() == 40
    monkeypatch.delenv(fr.BUFFER_ENV)
    monkeypatch.setenv(fr.LEGACY_BUFFER_ENV, "0")
    with pytest.raises(ValueError, match="switches the flight recorder off"):
        fr.switch_on()
    with pytest.raises(ValueError, match="size >= 1"):
        fr.switch_on(0)


def test_reading_a_folder_without_dumps_says_how_to_write_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        fr.load_records(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="launch_recorded"):
        fr.load_records(tmp_path)
    (tmp_path / "rank0.json").write_text(json.dumps({"entries": []}))
    with pytest.raises(ValueError, match="not a course flight-recorder dump"):
        fr.load_records(tmp_path)


def test_a_run_folder_that_holds_dumps_is_refused_before_any_process_starts(tmp_path):
    (tmp_path / "rank0.json").write_text("{}")
    with pytest.raises(ValueError, match="folder of its own"):
        fr.launch_recorded(print, 2, run_dir=tmp_path)


def test_records_name_the_peer_by_global_rank_and_the_receive_by_its_buffer():
    dump = {"rank": 1, "pg_config": {"3": {"name": "3", "desc": "pp", "ranks": "[2, 5]"}}, "entries": [
        {"process_group": ["3", "pp"], "profiling_name": "gloo:recv 1<-0", "is_p2p": True, "p2p_seq_id": 4,
         "collective_seq_id": 0, "input_sizes": [], "input_dtypes": [], "output_sizes": [[2, 3]],
         "output_dtypes": ["Float"], "where": "w.py:3 in f"}]}
    (rec,) = fr.records_of(dump)
    assert (rec.op, rec.peer, rec.group_ranks, rec.seq, rec.sizes) == ("recv", 2, (2, 5), 4, ((2, 3),))
    assert rec.describe() == "recv from 2 [[2, 3]] Float at w.py:3 in f"


def test_recording_puts_torch_distributed_back_as_it_was():
    before = {name: getattr(dist, name) for name in ("isend", "irecv", "send", "recv", "batch_isend_irecv")}
    check = c10d._check_op
    log = fr._P2PLog()
    log.install()
    assert dist.send is not before["send"] and dist.send.__wrapped__ is before["send"]
    assert dist.isend.__name__ == "isend"  # the NCCL-rules emulator tells a batch's sends by this name
    log.uninstall()
    assert {name: getattr(dist, name) for name in before} == before and c10d._check_op is check
