"""``--export_hf DIR``: the trained model of every mode as a Hugging Face GPT-2 folder (course.hf_export), ungraded.

Each case runs a script as a user would (its ``main``, a few steps of the tiny preset) with ``--export_hf``,
then loads the folder with ``transformers`` (``GPT2LMHeadModel.from_pretrained``,
``AutoTokenizer.from_pretrained``) and checks it against what the run itself measured with the trained
model, through the mode's own evaluation path (the data-parallel replica, the pipeline stages gathered,
the tensor-parallel shards with vocabulary-parallel logits, the 3D stages):

* the validation loss of the exported model on the whole validation set equals the run's
  ``validation_loss`` (every target token's logit enters it: a weight put back wrongly — Q/K/V columns
  in tp order, a transposed Conv1D, the padded vocabulary, a stage's layers missing, the weights from
  before training — moves it by far more than the 1e-5 allowed for float32 sums taken in another order);
* ``generate`` (greedy) continues ``source <eos_src>`` with the same tokens as the course's greedy decoder
  did for the run's BLEU (the translations file), and stops at ``<eos_tgt>``;
* the tokenizer saved beside the model encodes and decodes as the course's.
"""
from __future__ import annotations

import json
import shutil

import pytest

SMALL = ["--preset", "tiny", "--batch_size", "8", "--model_max_length", "32", "--vocab_size", "1000",
         "--max_train_examples", "2000", "--max_batches", "3", "--n_bleu", "4", "--dropout", "0", "--quiet",
         "--timeout", "300"]
CASES = {  # name: (script module, its options, results prefix)
    "dp": ("run_data_parallel", ["--dp", "2"], ""),
    "dp-zero3": ("run_data_parallel", ["--dp", "2", "--zero", "3"], ""),
    "1f1b": ("run_pipeline", ["--schedule", "1f1b", "--pp", "2", "--micro_batches", "2"],
             "pipeline_1f1b_"),
    "tp": ("run_tensor_parallel", ["--tp", "2"], "tensor_parallel_"),
    "3d": ("run_3d", ["--dp", "1", "--pp", "2", "--tp", "2", "--micro_batches", "2"], "three_d_"),
}


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    """One tokenizer for every case, trained on the same 2000 pairs the runs use."""
    from tests.support.rendezvous import tiny_tokenizer

    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def _run(case: str, workdir, tokenizer_file, *extra: str):
    import importlib

    module, options, prefix = CASES[case]
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(tokenizer_file, workdir / tokenizer_file.name)
    script = importlib.import_module(f"project.{module}")
    argv = [*options, *SMALL, "--workdir", str(workdir), *extra]
    args = script.parse_args(argv)
    assert script.main(argv) == 0
    return args, prefix


@pytest.mark.needs_solution
@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", list(CASES))
def test_the_exported_model_is_the_trained_one(case, tmp_path, tokenizer_file):
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from course.epoch_runner import evaluate_loss, validation_loader
    from course.task import prepare_data

    folder = tmp_path / "hf"
    args, prefix = _run(case, tmp_path / "work", tokenizer_file, "--export_hf", str(folder))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert not (tmp_path / "hf.tmp").exists()
    results = json.loads((tmp_path / "work" / f"{prefix}rank0_results_epoch0.json").read_text())
    translations = json.loads((tmp_path / "work" / f"{prefix}translations_epoch0.json").read_text())

    model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    data = prepare_data(args)
    loss = evaluate_loss(model, validation_loader(data.validation, collate=data.collate), "cpu")
    assert loss == pytest.approx(results["validation_loss"], rel=1e-5), (
        f"{case}: the exported model's validation loss {loss} is not the trained model's {results['validation_loss']}")

    eos_src, eos_tgt = data.tokenizer.eos_src_id, data.tokenizer.eos_tgt_id
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (eos_tgt,
                                                                                             data.tokenizer.pad_id)
    for example, seen in zip(data.test[: args.n_bleu], translations):
        source = example["src"]
        ids = tokenizer(source).input_ids
        assert ids == data.tokenizer.encode(source), "the saved tokenizer encodes differently"
        prompt = torch.tensor([ids[: args.model_max_length // 2] + [eos_src]])
        with torch.no_grad():
            out = model.generate(prompt, max_length=args.model_max_length, do_sample=False)
        new = out[0, prompt.shape[1]:].tolist()
        text = tokenizer.decode(new[:-1] if new and new[-1] == eos_tgt else new, skip_special_tokens=True)
        assert text == seen["hypothesis"], f"{case}: generate gave {text!r}, the course's decoder {seen['hypothesis']!r}"


def test_an_export_that_cannot_be_made_stops_before_any_process_starts(tmp_path, capsys):
    from project import run_data_parallel, run_moe, run_tensor_parallel

    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "config.json").write_text("{}")
    cases = [(run_moe, ["--dp", "2"], "transformers has no GPT-2 with mixture-of-experts"),
             (run_moe, ["--dp", "2", "--dense", "--top_k", "2"], "only --top_k 1 exports"),
             (run_tensor_parallel, ["--tp", "2", "--block_types", "spd"], "only --block_types tp exports"),
             (run_data_parallel, ["--dp", "2", "--export_hf", str(occupied)], "already exists and is not empty")]
    for script, argv, message in cases:
        if "--export_hf" not in argv:
            argv = [*argv, "--export_hf", str(tmp_path / "out")]
        with pytest.raises(SystemExit):
            script.parse_args([*argv, "--workdir", str(tmp_path / "work")])
        assert message in capsys.readouterr().err, (script.__name__, argv)
    assert run_moe.parse_args(["--dp", "2", "--dense", "--top_k", "1", "--export_hf", str(tmp_path / "out"),
                               "--workdir", str(tmp_path / "work")]).export_hf
