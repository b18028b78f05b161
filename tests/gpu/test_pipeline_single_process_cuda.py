"""GPU tier: the one-process pipeline modes of ``project/run_pipeline.py`` on 2 GPUs (stage s on ``cuda:s``, one
worker thread per stage): ``--single_process sequential`` and ``pipe`` train on Multi30k (found by the course's
resolution order: staged by Modal's ``--gpu-tests``), record both devices, and compute what the CPU computes."""
import json

import pytest

from tests.gpu.support import multi30k_dir, need_gpus

pytestmark = pytest.mark.gpu


def _run(workdir, mode, device):
    from project.run_pipeline import main

    argv = ["--single_process", mode, "--pp", "2", "--device", device, "--preset", "tiny", "--batch_size", "8",
            "--micro_batches", "2", "--max_batches", "2", "--max_val_batches", "1", "--n_bleu", "2", "--dropout", "0",
            "--vocab_size", "1000", "--max_train_examples", "2000", "--data_dir", multi30k_dir(),
            "--workdir", str(workdir), "--quiet", "--overwrite", "--timeout", "600"]
    assert main(argv) == 0, f"{mode} on {device} failed"
    return json.loads((workdir / f"pipeline_{mode}_rank0_results_epoch0.json").read_text())


@pytest.mark.timeout(900)
def test_single_process_pipeline_on_two_gpus(tmp_path):
    need_gpus(2)
    on_gpus = {mode: _run(tmp_path, mode, "cuda") for mode in ("sequential", "pipe")}
    on_cpu = _run(tmp_path / "cpu", "pipe", "cpu")
    for mode, r in on_gpus.items():
        assert r["config"]["devices"] == ["cuda:0", "cuda:1"], (mode, r["config"].get("devices"))
        assert {e["stage"] for e in r["timeline"]} == {0, 1}
        assert set(r["peak_memory_bytes_by_device"]) == {"cuda:0", "cuda:1"}, r["peak_memory_bytes_by_device"]
    # the same model on the same batches (dropout 0): the first loss, before any update, differs by float32
    # rounding only; after Adam's first step rounding becomes lr-sized steps (1e-3 here, as in
    # tests/pipeline/test_run_script.py's comparison of the modes: 1e-4 on the losses)
    assert on_gpus["pipe"]["train_losses"] == pytest.approx(on_gpus["sequential"]["train_losses"],
                                                                         abs=1e-4)
    assert on_gpus["pipe"]["train_losses"][0] == pytest.approx(on_cpu["train_losses"][0], abs=1e-4)
