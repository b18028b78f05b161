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


def test_a_mixed_groups_gloo_and_nccl_records_are_two_sequences(tmp_path, monkeypatch):
    # a "cpu:gloo,cuda:nccl" group numbers its host-tensor and its CUDA collectives apart (two recorders; seen on an
    # H100 with torch 2.11): both #1s must not be lined up together
    def entry(rid, name, seq, t):
        return {"record_id": rid, "process_group": ["0", "default_pg"], "profiling_name": name, "is_p2p": False,
                "collective_seq_id": seq, "p2p_seq_id": 0, "input_sizes": [[4]], "input_dtypes": ["Float"],
                "output_sizes": [[4]], "output_dtypes": ["Float"], "time_created_ns": t, "state": "completed",
                "frames": [{"name": "step", "filename": "train.py", "line": 7}]}
    dumps = {"gloo": {"version": "2.10", "entries": [entry(0, "gloo:all_reduce", 1, 10), entry(1, "gloo:broadcast", 2, 30)]},
             "nccl": {"version": "2.10", "entries": [entry(0, "nccl:all_reduce", 1, 20)]}}
    monkeypatch.setattr(fr, "_torch_dump", lambda recorder="gloo": dumps[recorder])
    monkeypatch.setattr(fr, "_group_table", lambda: {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}})
    fr.dump_records(tmp_path, 0, 2)
    records = fr.load_records(tmp_path)[0]
    assert [(r.group, r.seq, r.op, r.group_ranks, r.where) for r in records] == [
        ("0", 1, "all_reduce", (0, 1), "train.py:7 in step"), ("0:nccl", 1, "all_reduce", (0, 1), "train.py:7 in step"),
        ("0", 2, "broadcast", (0, 1), "train.py:7 in step")]
    assert (tmp_path / "torch" / "rank_0").is_file() and (tmp_path / "torch_nccl" / "rank_0").is_file()
