"""The trained model as a Hugging Face GPT-2 folder (``--export_hf DIR`` of every run script).

After the last epoch each mode puts its model's weights together as one ``transformers``
``GPT2LMHeadModel`` state dict (:meth:`course.epoch_runner.TrainingMode.export_state`: a data-parallel
replica as it is, ZeRO-3 shards gathered, pipeline stages gathered over pp, tensor-parallel shards
gathered over tp with the fused Q/K/V columns put back in GPT-2's order), and :func:`export_hf` writes
it in the format ``save_pretrained`` writes and ``from_pretrained`` reads:

* ``config.json``, ``generation_config.json`` and ``model.safetensors`` — the GPT-2 of the run's preset
  (the course's ``GPT2Config``), with ``eos_token_id`` the end-of-target token and ``pad_token_id``
  the padding token, so ``generate`` stops where the course's greedy decoder stops;
* ``tokenizer.json``, ``tokenizer_config.json`` — the run's byte-level BPE as a
  ``PreTrainedTokenizerFast`` (``AutoTokenizer.from_pretrained(DIR)``), its special tokens named;
* ``README.md`` — how to prompt it: the source sentence's tokens, then ``<eos_{src}>``; the model
  continues with the translation and ``<eos_{tgt}>`` (the course's sequence format, course.collate).

The weights travel through the course's one checkpoint format: :func:`course.checkpoint.save_final_weights`
writes them as a ``torch.distributed.checkpoint`` folder (each tensor once, whichever ranks hold it) and
converts it to one ``torch.save`` file (``dcp_to_torch_save``); rank 0 loads that file into a
``GPT2LMHeadModel`` and calls ``save_pretrained``. Everything is written under ``DIR.tmp`` and renamed
to ``DIR`` at the end, so a crash never leaves half an export where a reader would find it.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

MODEL_CARD = """# {name}

A GPT-2 ({preset} preset: {n_layer} layers, {n_embd} wide, {n_head} heads, {vocab_size} tokens) trained by the
course's `{mode}` mode to translate {src} to {tgt} (Multi30k), exported with `--export_hf`.

Prompt: the source sentence's tokens followed by `<eos_{src}>`; the model continues with the translation
and ends it with `<eos_{tgt}>` (`eos_token_id`). Greedy decoding:

```python
import torch
from transformers import AutoTokenizer, GPT2LMHeadModel

tokenizer = AutoTokenizer.from_pretrained("{folder}")
model = GPT2LMHeadModel.from_pretrained("{folder}")
ids = tokenizer("Ein Hund läuft im Schnee.", return_tensors="pt").input_ids
prompt = torch.cat([ids, torch.tensor([[tokenizer.convert_tokens_to_ids("<eos_{src}>")]])], dim=1)
out = model.generate(prompt, do_sample=False)  # greedy, up to n_positions tokens, stops at <eos_{tgt}>
print(tokenizer.decode(out[0, prompt.shape[1]:], skip_special_tokens=True))
```
"""


def hf_config(config, tokenizer):
    """The ``transformers.GPT2Config`` the run's model was built from (``course.task.build_model``), with the
    course's end-of-target and padding tokens as ``eos_token_id`` and ``pad_token_id``."""
    from course.model import gpt2_config

    gpt2 = gpt2_config(config.preset, tokenizer.vocab_size, n_positions=config.model_max_length, dropout=config.dropout)
    gpt2.eos_token_id, gpt2.pad_token_id = tokenizer.eos_tgt_id, tokenizer.pad_id
    return gpt2


def hf_tokenizer(tokenizer, model_max_length: int):
    """The course tokenizer (:class:`course.tokenizer.CourseTokenizer`) as a ``PreTrainedTokenizerFast``."""
    from transformers import PreTrainedTokenizerFast

    from course.tokenizer import PAD, special_tokens

    eos_src, eos_tgt, _ = special_tokens(tokenizer.src_lang, tokenizer.tgt_lang)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer.tokenizer, eos_token=eos_tgt, pad_token=PAD,
                                   additional_special_tokens=[eos_src], model_max_length=model_max_length)


def export_hf(state: dict[str, torch.Tensor], config, tokenizer, *, mode: str = "training", rank: int = 0,
              group=None) -> Path:
    """Write ``state`` (a ``GPT2LMHeadModel`` state dict of full tensors) and the tokenizer as a Hugging Face
    folder at ``config.export_hf`` (collective over ``group``, the run's world: every rank passes the
    state it holds; DCP writes each tensor once).

    Args:
        state: ``{"transformer.wte.weight": (vocab, n_embd), ..., "lm_head.weight": ...}``, every tensor
            the full one (the keys and shapes of ``course.model.build_gpt2``'s model).
        config: the run's configuration (``preset``, ``model_max_length``, ``dropout``, ``export_hf``,
            ``src_lang``, ``tgt_lang``).
        tokenizer: the run's :class:`course.tokenizer.CourseTokenizer`.
        mode: the training mode's name (for the model card).

    Returns:
        The folder.

    Raises:
        ValueError: ``state`` is not the preset's GPT-2 (missing, extra or misshaped tensors).
    """
    from course.checkpoint import save_final_weights

    folder = Path(config.export_hf)
    tmp = folder.with_name(folder.name + ".tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if dist.is_initialized():
        dist.barrier(group=group)
    weights = save_final_weights(state, tmp / "weights.pt", rank=rank, group=group)
    if rank == 0:
        _write_folder(torch.load(weights, map_location="cpu", weights_only=True), config, tokenizer, mode, tmp, folder)
        weights.unlink()
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    if dist.is_initialized():
        dist.barrier(group=group)
    return folder


def _write_folder(state: dict, config, tokenizer, mode: str, tmp: Path, folder: Path) -> None:
    from transformers import GenerationConfig, GPT2LMHeadModel

    gpt2 = hf_config(config, tokenizer)
    model = GPT2LMHeadModel(gpt2)
    expected = model.state_dict()
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(expected) & set(state) if tuple(expected[k].shape) != tuple(state[k].shape))
    if missing or extra or wrong:
        raise ValueError(f"--export_hf: the {mode} model's weights are not the {config.preset} GPT-2's (missing "
                         f"{missing[:3]}, unexpected {extra[:3]}, misshaped {wrong[:3]})")
    model.load_state_dict(state)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_tgt_id, pad_token_id=tokenizer.pad_id,
                                               max_length=gpt2.n_positions, do_sample=False)
    model.save_pretrained(tmp)
    hf_tokenizer(tokenizer, config.model_max_length).save_pretrained(tmp)
    shape = config.model_shape
    (tmp / "README.md").write_text(MODEL_CARD.format(
        name=folder.name, preset=config.preset, n_layer=shape["n_layer"], n_embd=shape["n_embd"],
        n_head=shape["n_head"], vocab_size=tokenizer.vocab_size, mode=mode, src=tokenizer.src_lang,
        tgt=tokenizer.tgt_lang, folder=folder))
    (tmp / "course_run.json").write_text(json.dumps({"mode": mode, "config": config.record()}, indent=1,
                                                    default=str))
