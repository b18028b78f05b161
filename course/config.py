"""The run configuration: one dataclass per run, built once from the command line, checked before
any process starts, and handed to every rank.

Every run script declares its configuration as a subclass of :class:`RunConfig` (the options every
run shares: data, model and training, mesh, run, checkpoints) with its own fields and checks, and
starts with ``config = MyConfig.from_command_line()``. The command line is made from the fields
(``--name``, the field's type, default and help), so every script takes the same option names for
the same thing — ``--dp --pp --tp --cp --ep``, ``--micro_batches``, ``--virtual_stages``,
``--device``, ``--backend`` — and a field's declaration is its documentation.

:meth:`RunConfig.from_command_line` parses, fills in what ``auto`` means (device and back-end,
model preset, a mesh size taken from torchrun's ``WORLD_SIZE``), runs :meth:`RunConfig.check`
(plain rules on the values, :class:`ConfigError`) and :meth:`RunConfig.check_environment` (the data
folder, the cached tokenizer, the work directory, the checkpoint to resume), and ends the script
with a message that says what to change (exit code 2) if any fails. The configuration is a plain
picklable dataclass: the launcher passes it to every rank, and :meth:`RunConfig.record` is what the
results files keep under ``config``.

The fields, their choices and :meth:`RunConfig.check` import without torch (the device is resolved by
:mod:`course.launch`, imported only to do that), so that a run meant for another machine is checked here
first with the same rules: :meth:`RunConfig.for_machine` (``modal run`` on a laptop,
``project/modal_support.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from course.dims import ParallelDims
from course.environment import in_torchrun
from course.model import PRESETS, default_preset

GROUPS = ("data", "model and training", "mesh", "run", "measurement", "checkpoints and restarts")


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which option to change and how."""


def option(default: Any, help: str, *, group: str, choices: tuple | None = None, metavar: str | None = None):
    """A configuration field that is also a command-line option ``--<field name>``.

    Args:
        default: the value without the option (None: decided later, e.g. from torchrun).
        help: what it is, with its unit.
        group: the ``--help`` section (one of :data:`GROUPS`, or the script's own).
        choices: the allowed values.
        metavar: how ``--help`` names the value.
    """
    return field(default=default, metadata={"help": help, "group": group, "choices": choices, "metavar": metavar})


def _kind(f: dataclasses.Field) -> type:
    text = str(f.type).replace(" ", "")
    base = text.replace("|None", "").replace("None|", "")
    return {"int": int, "float": float, "str": str, "bool": bool}[base]


@dataclass
class RunConfig:
    """The options every run takes. A script's configuration subclasses it.

    Attributes (command-line options of the same name): see each field's help; the mesh sizes
    ``dp, pp, tp, cp, ep`` give :attr:`dims`; ``micro_batches`` is the number of micro-batches
    a pipeline cuts each (per-dp-rank) batch into; ``virtual_stages`` the model chunks per
    pipeline rank (interleaved 1F1B).
    """

    # ---- data ----
    dataset: str = option("multi30k", "'multi30k' (local files) or a Hugging Face dataset with a 'translation' column",
                          group="data")
    data_dir: str | None = option(None, "folder holding the Multi30k *.gz files", group="data")
    src_lang: str = option("de", "source language", group="data")
    tgt_lang: str = option("en", "target language", group="data")
    vocab_size: int = option(5000, "BPE vocabulary size (tokens)", group="data")
    model_max_length: int = option(128, "longest sequence (tokens)", group="data")
    max_train_examples: int | None = option(None, "train on the first N training pairs only (quick runs and tests; "
                                                  "the tokenizer is trained on them too)", group="data", metavar="N")
    # ---- model and training ----
    preset: str = option("auto", "GPT-2 size; auto: tiny on CPU, gpt2 on GPU", group="model and training",
                         choices=("auto", *PRESETS))
    batch_size: int = option(64, "global batch size (sequences per optimizer step)", group="model and training")
    n_epochs: int = option(1, "epochs", group="model and training")
    learning_rate: float = option(1e-3, "AdamW learning rate", group="model and training")
    max_batches: int | None = option(None, "stop each epoch after this many batches (quick runs)",
                                     group="model and training")
    n_bleu: int = option(100, "test sentences translated for BLEU (0: skip)", group="model and training")
    max_val_batches: int | None = option(None, "validation batches (of 64 sentences) scored after each epoch: "
                                               "the first N x 64 validation pairs, however many ranks share them "
                                               "(default: all)", group="model and training")
    dropout: float = option(0.1, "GPT-2 dropout probability (0 for exact comparisons)", group="model and training")
    seed: int = option(11, "random seed (data order, initial weights, dropout)", group="model and training")
    # ---- mesh ----
    dp: int | None = option(1, "data-parallel replicas", group="mesh")
    pp: int | None = option(1, "pipeline stages", group="mesh")
    tp: int | None = option(1, "tensor-parallel ranks per stage", group="mesh")
    cp: int = option(1, "context-parallel ranks (each holds a part of every sequence)", group="mesh")
    ep: int = option(1, "expert-parallel ranks (carved out of dp x cp)", group="mesh")
    micro_batches: int = option(1, "micro-batches per (per-dp-rank) batch in a pipeline", group="mesh")
    virtual_stages: int | None = option(1, "model chunks per pipeline rank (interleaved 1F1B)", group="mesh")
    # ---- run ----
    workdir: str = option("workdir", "where results, translations, checkpoints and the tokenizer go", group="run")
    overwrite: bool = option(False, "replace this mode's results already in --workdir (without it, the run "
                                    "refuses to start)", group="run")
    device: str = option("auto", "auto: CUDA with one GPU per local rank when there are enough, else CPU",
                         group="run", choices=("auto", "cpu", "cuda"))
    backend: str = option("auto", "auto: nccl on CUDA, gloo on CPU", group="run", choices=("auto", "gloo", "nccl"))
    timeout: float = option(3600.0, "wall-clock limit of the whole run (seconds)", group="run")
    quiet: bool = option(False, "no progress bar", group="run")
    # ---- measurement (course.trace, course.profiler) ----
    trace: str | None = option(None, "write a Chrome/Perfetto trace of the run to FILE: every rank's training steps, "
                                     "forwards and backwards, optimizer steps, communication (group, bytes, peer), "
                                     "evaluation and checkpoints on one clock", group="measurement", metavar="FILE")
    trace_steps: int = option(20, "training steps the trace keeps (the run's last ones; evaluation and checkpoints "
                                  "are all kept)", group="measurement", metavar="N")
    profile: bool = option(False, "torch.profiler trace of 3 training steps (after the first) per rank, "
                                  "<workdir>/<results prefix>rank<r>_torch_profile.json; with --trace also put into "
                                  "its file, on the same clock", group="measurement")
    # ---- checkpoints and restarts ----
    checkpoint_every: int | None = option(None, "write a checkpoint (torch.distributed.checkpoint) every N optimizer "
                                                "steps", group="checkpoints and restarts", metavar="N")
    resume: str | None = option(None, "continue from a checkpoint folder, or from this mode's latest one in --workdir",
                                group="checkpoints and restarts", metavar="DIR|latest")
    max_restarts: int = option(0, "when a rank dies, start every rank again from the latest checkpoint, up to this "
                                  "many times (under torchrun use torchrun's own --max_restarts)",
                               group="checkpoints and restarts")
    async_checkpoint: bool = option(False, "write each checkpoint in the background (torch.distributed.checkpoint."
                                           "async_save) while the next steps run; 'latest' names it once its files "
                                           "are complete", group="checkpoints and restarts")
    export_hf: str | None = option(None, "after training, write the model and tokenizer as a Hugging Face GPT-2 "
                                         "folder (GPT2LMHeadModel.from_pretrained(DIR))",
                                   group="checkpoints and restarts", metavar="DIR")

    # What a script sets about itself (not options).
    description: ClassVar[str] = "a course run"
    results_prefix: ClassVar[str] = ""        # results files: {prefix}rank{r}_results_epoch{e}.json
    mesh_options: ClassVar[tuple[str, ...]] = ("dp",)  # the mesh options this script takes
    world_option: ClassVar[str | None] = "dp"  # a mesh size that defaults to torchrun's WORLD_SIZE (else 2)
    resumes_at_another_world_size: ClassVar[bool] = False  # its checkpoints load at another number of ranks

    def export_refusal(self) -> str | None:
        """Why this run cannot ``--export_hf`` (None: it can). Scripts whose model is not a GPT-2 say so."""
        return None

    # ---- building it ---------------------------------------------------------------------------
    @classmethod
    def parser(cls, prog: str | None = None) -> argparse.ArgumentParser:
        """The command line made from the fields (``--help`` lists them by group); ``prog``: the command its
        usage and errors name (default: the script's file name)."""
        parser = argparse.ArgumentParser(prog=prog, description=cls.description,
                                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        groups: dict[str, argparse._ArgumentGroup] = {}
        for f in dataclasses.fields(cls):
            meta = f.metadata
            if not meta or (meta["group"] == "mesh" and f.name not in cls.mesh_options):
                continue
            group = groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
            kind = _kind(f)
            if kind is bool:
                group.add_argument(f"--{f.name}", action="store_true", help=meta["help"])
            else:
                group.add_argument(f"--{f.name}", type=kind, default=f.default, choices=meta["choices"],
                                   help=meta["help"], metavar=meta["metavar"])
        # "-1e-3" looks like an option to argparse; read it as a number so that a negative value gets the
        # clear "must be positive" message instead of "expected one argument".
        parser._negative_number_matcher = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d*\.?\d+[eE][-+]?\d+$")
        return parser

    @classmethod
    def from_command_line(cls, argv: list[str] | None = None, *, environment: bool = True, prog: str | None = None):
        """Parse ``argv``, fill in the automatic values, check the configuration (and, with
        ``environment``, the data, tokenizer, work directory and checkpoint). Exits through
        ``parser.error`` (code 2) with a message that says what to change (``prog``: see :meth:`parser`)."""
        parser = cls.parser(prog)
        values = vars(parser.parse_args(argv))
        config = cls(**values)
        try:
            config.resolve()
            config.check()
            if environment:
                config.check_environment()
        except ConfigError as exc:
            parser.error(str(exc))
        return config

    @classmethod
    def for_test(cls, **values):
        """A configuration from keyword values (defaults elsewhere), resolved and checked, without the
        environment checks — for tests and notebooks. Raises :class:`ConfigError`."""
        config = cls(**values)
        config.resolve()
        config.check()
        return config

    @classmethod
    def for_machine(cls, devices: int, **values):
        """A configuration from keyword values for a run on ``devices`` GPUs of another machine, resolved and
        checked as the run will be there, without torch and without the environment checks (``modal run``:
        :mod:`project.modal_support`). ``device`` and ``backend`` are taken as given, not resolved against
        this machine's GPUs. Raises :class:`ConfigError`; first if the mesh does not have one rank per device."""
        config = cls(**values)
        config.resolve(devices, here=False)
        try:
            config.dims.check(devices)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        config.check()
        return config

    def resolve(self, devices: int | None = None, *, here: bool = True) -> None:
        """Fill in ``auto`` and ``None``: the script's main mesh size from ``devices`` (the run's devices, one
        process each; None: torchrun's ``WORLD_SIZE``, else 2), the device and back-end (``here``: for this
        machine, :func:`course.launch.resolve_device_backend`; else as given), the preset."""
        if self.world_option and getattr(self, self.world_option) is None:
            setattr(self, self.world_option, devices or (int(os.environ["WORLD_SIZE"]) if in_torchrun() else 2))
        for name in ("dp", "pp", "tp", "virtual_stages"):
            if getattr(self, name) is None:
                setattr(self, name, 1)
        if here:
            from course.launch import resolve_device_backend  # imports torch

            try:
                self.device, self.backend = resolve_device_backend(self.device, self.backend, self.world_size)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if self.preset == "auto":
            self.preset = default_preset(self.device)

    # ---- what it describes -------------------------------------------------------------------------
    @property
    def dims(self):
        """The mesh sizes as :class:`course.dims.ParallelDims`."""
        return ParallelDims(dp=self.dp, pp=self.pp, tp=self.tp, cp=self.cp, ep=self.ep)

    @property
    def world_size(self) -> int:
        """Processes the run starts: ``dp * pp * cp * tp``."""
        return self.dp * self.pp * self.cp * self.tp

    @property
    def model_shape(self) -> dict:
        """``n_layer``, ``n_embd``, ``n_head``, ``n_inner`` of the preset (resolved)."""
        shape = dict(PRESETS[self.preset])
        shape.setdefault("n_inner", 4 * shape["n_embd"])
        return shape

    def record(self, **extra) -> dict:
        """The configuration as results files keep it (every field, and ``extra``)."""
        return dict(dataclasses.asdict(self), **extra)

    # ---- checks ------------------------------------------------------------------------------------
    def check(self) -> None:
        """Rules on the values alone (no file system). Raises :class:`ConfigError`."""
        for name in ("batch_size", "n_epochs", "learning_rate"):
            value = getattr(self, name)
            if not value > 0:  # also refuses nan
                raise ConfigError(f"--{name} must be positive, not {value}")
        if self.max_batches is not None and self.max_batches < 1:
            default = {f.name: f.default for f in dataclasses.fields(self)}["max_batches"]
            hint = "or left out for whole epochs" if default is None else \
                f"it is {default} by default here; give a larger number for longer epochs"
            raise ConfigError(f"--max_batches must be >= 1 batches per epoch ({hint}), not {self.max_batches}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"--dropout must be in [0, 1), not {self.dropout}")
        if self.n_bleu < 0:
            raise ConfigError(f"--n_bleu must be >= 0, not {self.n_bleu}")
        if self.model_max_length < 4:
            raise ConfigError(f"--model_max_length must be >= 4, not {self.model_max_length}")
        if self.max_train_examples is not None and self.max_train_examples < 1:
            raise ConfigError(f"--max_train_examples must be >= 1 (training pairs), not {self.max_train_examples}")
        if self.vocab_size < 300:
            raise ConfigError(f"--vocab_size must be >= 300 for a byte-level BPE, not {self.vocab_size}")
        if self.max_val_batches is not None and self.max_val_batches < 1:
            raise ConfigError(f"--max_val_batches must be >= 1, not {self.max_val_batches}")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ConfigError(f"--checkpoint_every must be >= 1 (optimizer steps), not {self.checkpoint_every}")
        if self.max_restarts < 0:
            raise ConfigError(f"--max_restarts must be >= 0, not {self.max_restarts}")
        if self.max_restarts and in_torchrun():
            raise ConfigError("--max_restarts is the launcher's; under torchrun pass --max_restarts to torchrun "
                              "instead")
        if self.max_restarts and not self.checkpoint_every:
            raise ConfigError("--max_restarts restarts from the latest checkpoint: also give --checkpoint_every N")
        if self.async_checkpoint and not self.checkpoint_every:
            raise ConfigError("--async_checkpoint writes the checkpoints of --checkpoint_every N in the background: "
                              "also give --checkpoint_every N")
        if self.export_hf is not None and self.export_refusal():
            raise ConfigError(f"--export_hf: {self.export_refusal()}")
        if self.micro_batches < 1:
            raise ConfigError(f"--micro_batches must be >= 1 (micro-batches per batch), not {self.micro_batches}")
        if self.trace_steps < 1:
            raise ConfigError(f"--trace_steps must be >= 1 (training steps the trace keeps), not {self.trace_steps}")
        if self.virtual_stages < 1:
            raise ConfigError(f"--virtual_stages must be >= 1 (model chunks per pipeline rank), "
                              f"not {self.virtual_stages}")
        try:
            dims = self.dims
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for name in ("dp", "pp", "tp", "cp", "ep", "micro_batches", "virtual_stages"):
            if getattr(self, name) > 1 and name not in self.mesh_options:
                sizes = ", ".join("--" + o for o in self.mesh_options)
                raise ConfigError(f"this run takes {sizes}, not --{name} {getattr(self, name)} (project/run_3d.py "
                                  "combines dp, pp and tp)")
        if in_torchrun() and self.world_size != int(os.environ["WORLD_SIZE"]):
            raise ConfigError(f"the mesh has {self.world_size} ranks, but torchrun started WORLD_SIZE="
                              f"{os.environ['WORLD_SIZE']} processes; make them agree")
        shape = self.model_shape
        try:
            dims.check(n_layer=shape["n_layer"], n_head=shape["n_head"], n_inner=shape["n_inner"])
        except ValueError as exc:
            raise ConfigError(f"{exc} (preset {self.preset!r})") from None

    def check_environment(self) -> None:
        """Checks that read the file system, in the parent process before any worker starts: the data
        folder, a cached tokenizer, the work directory (writable; no results of this mode replaced
        without ``--overwrite``), the checkpoint to resume, room for checkpoints. Raises
        :class:`ConfigError`."""
        from course.data import DataNotFoundError, resolve_data_dir, verify_multi30k
        from course.tokenizer import tokenizer_path, verify_cached_tokenizer

        try:
            if self.dataset == "multi30k" and not in_torchrun():
                verify_multi30k(resolve_data_dir(self.data_dir))
            verify_cached_tokenizer(tokenizer_path(self.workdir, self.dataset, self.vocab_size, self.src_lang,
                                                   self.tgt_lang, self.max_train_examples), self.src_lang,
                                    self.tgt_lang)
            if not in_torchrun() or os.environ.get("RANK") == "0":  # under torchrun, one process checks
                check_workdir(self.workdir, self.results_prefix, self.overwrite, resuming=self.resume is not None)
                check_measurement_files(self)
                if self.resume is not None:
                    from course.checkpoint import checkpoint_root, resolve_resume, saved_world_size

                    found = resolve_resume(self.resume, checkpoint_root(self.workdir, self.results_prefix))
                    try:
                        saved = saved_world_size(found)
                    except ValueError:  # not a run's checkpoint: the script's own checks, or loading, say more
                        saved = self.world_size
                    if saved != self.world_size and not self.resumes_at_another_world_size:
                        raise ConfigError(f"--resume {self.resume}: the checkpoint was written by {saved} ranks and "
                                          f"this run has {self.world_size}; this script resumes at the same number "
                                          f"of ranks only (project/run_data_parallel.py resumes at another --dp)")
                if self.export_hf is not None:
                    check_export_folder(self.export_hf, self.overwrite)
                if self.checkpoint_every:
                    from course.checkpoint import check_free_space
                    from course.model import estimate_parameters

                    check_free_space(self.workdir, estimate_parameters(self.preset, self.vocab_size,
                                                                       self.model_max_length))
        except (DataNotFoundError, ValueError, FileNotFoundError) as exc:
            raise ConfigError(str(exc)) from None


def check_export_folder(folder, overwrite: bool) -> None:
    """``--export_hf DIR``: refuse, before any process starts, a ``DIR`` that already holds files (unless
    ``overwrite``: it is replaced at the end of the run) or whose parent cannot be written to.

    Raises:
        ValueError: naming what to change.
    """
    import tempfile
    from pathlib import Path

    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())) and not overwrite:
        raise ValueError(f"--export_hf {folder} already exists and is not empty; pass --overwrite to replace it at the "
                         "end of the run, or choose another folder")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder.parent, prefix=".write_check_"):
            pass
    except OSError as exc:
        raise ValueError(f"--export_hf {folder}: its folder cannot be written to ({exc.strerror or exc}); choose "
                         "another") from None


def check_measurement_files(config: RunConfig) -> None:
    """Before any process starts: ``--trace FILE`` can be written and replaces no file, and ``--profile`` replaces
    no profile of this mode in ``--workdir``, unless ``--overwrite`` (which deletes the old profiles).

    Raises:
        ValueError: naming the file and what to change.
    """
    from pathlib import Path

    if config.trace is not None:
        path = Path(config.trace)
        if path.is_dir():
            raise ValueError(f"--trace {path} is a folder; give a file name, e.g. --trace {path / 'trace.json'}")
        if path.exists() and not config.overwrite:
            raise ValueError(f"--trace {path} already exists; pass --overwrite to replace it, or choose another file")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--trace {path}: its folder cannot be created ({exc.strerror or exc})") from None
        if not os.access(path.parent, os.W_OK):
            raise ValueError(f"--trace {path}: its folder {path.parent} cannot be written to; choose another file")
    if config.profile:
        existing = sorted(Path(config.workdir).glob(f"{config.results_prefix}rank*_torch_profile.json"))
        if existing and not config.overwrite:
            raise ValueError(f"--workdir {config.workdir} already holds profiles of this mode ({existing[0].name}); pass "
                             "--overwrite to replace them, or choose another --workdir")
        for old in existing:
            os.remove(old)


def check_workdir(workdir, results_prefix: str, overwrite: bool, resuming: bool = False) -> None:
    """Check, before any process starts, that results can be written to ``workdir`` and that
    none would be silently replaced.

    Raises:
        ValueError: the folder cannot be created or written to; or it already holds results
            files ``{results_prefix}rank*_results_epoch*.json`` and neither ``overwrite`` (they
            are deleted) nor ``resuming`` (they are kept: the run continues) is set.
    """
    import os
    import tempfile
    from pathlib import Path

    folder = Path(workdir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write_check_"):
            pass
    except OSError as exc:
        raise ValueError(f"--workdir {folder} cannot be written to ({exc.strerror or exc}); choose a folder you can "
                         "write to, or fix its permissions") from None
    existing = sorted(p.name for p in folder.glob(f"{results_prefix}rank*_results_epoch*.json"))
    if resuming:
        return  # a resumed run continues in its own folder: its results are expected there
    if existing and not overwrite:
        raise ValueError(f"--workdir {folder} already holds results of this mode ({existing[0]}"
                         f"{f' and {len(existing) - 1} more' if len(existing) > 1 else ''}); pass --overwrite to replace "
                         "them, or choose another --workdir")
    if existing:
        for name in existing:
            os.remove(folder / name)
