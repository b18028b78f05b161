"""The run configuration: one table of every option, one dataclass per command, built once from the command line,
checked before any process starts, and handed to every rank.

:class:`RunConfig` is the one option table: every option a run script, a benchmark or the planner takes is a field
here, declared once — its name (the command-line option ``--name``), type, default, help, choices and ``--help``
section (:data:`GROUPS`). A field's declaration is its documentation. Every command takes the options of the
sections every run shares (:data:`EVERY_RUN`: data, model and training, run, measurement, checkpoints); a
command's own configuration (a subclass, e.g. ``project/options/run_pipeline.py``'s) names the other options it
takes (``takes``: mesh sizes, schedule, memory, ...) and says, as data, where it differs from the table:
``defaults`` (its own default of an option), ``choices`` (a narrower or wider set of values) and ``notes`` (a
sentence added to the option's help). So every script takes the same option names for the same thing —
``--dp --pp --tp --cp --ep``, ``--micro_batches``, ``--virtual_stages``, ``--schedule``, ``--device``,
``--backend`` — and the benchmarks take theirs from the same table (:func:`add_option`, through
:mod:`course.benchmarking`).

:meth:`RunConfig.from_command_line` parses, fills in what ``auto`` means (device and back-end, model preset, a mesh
size taken from torchrun's ``WORLD_SIZE``), runs :meth:`RunConfig.check` (plain rules on the values,
:class:`ConfigError`) and :meth:`RunConfig.check_environment` (the data folder, the cached tokenizer, the work
directory, the checkpoint to resume: :mod:`course.preflight`), and ends the script with a message that says what to
change (exit code 2) if any fails. The configuration is a plain picklable dataclass: the launcher passes it to every
rank, and :meth:`RunConfig.record` is what the results files keep under ``config``.

The fields, their choices and :meth:`RunConfig.check` import without torch (the device is resolved by
:mod:`course.launch`, imported only to do that), so that a run meant for another machine is checked here
first with the same rules: :meth:`RunConfig.for_machine` (``modal run`` on a laptop,
``project/tools/modal_support.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from course.cli import OptionParser
from course.dims import ParallelDims
from course.environment import in_torchrun
from course.model import PRESETS, default_preset
from course.preflight import check_run_files, check_workdir

COMMUNICATION = "gradient communication (notebooks/04_communication.ipynb)"
MEMORY = "memory (notebooks/05_memory.ipynb)"
FAULT_TOLERANCE = "fault tolerance (notebooks/11_training_through_failures.ipynb)"
DRILL = "failure drill"
# The --help sections, in order; the first five are every run's, the others hold options a command takes by name.
EVERY_RUN = ("data", "model and training", "run", "measurement", "checkpoints and restarts")
GROUPS = (*EVERY_RUN, "mesh", "pipeline", "tensor parallelism", "3D parallelism", "context parallelism",
          "mixture of experts", COMMUNICATION, MEMORY, FAULT_TOLERANCE, DRILL, "model shape")
MESH = ("dp", "pp", "tp", "cp", "ep")  # the mesh sizes (course.dims.ParallelDims), recorded for every run
ZEROPP = ("qwz", "hpz", "qgz")  # ZeRO++'s parts (--zeropp; memory.zeropp)


# (option, its smallest value, what it counts): RunConfig.check's lower bounds, in its order
MINIMUM = (("n_bleu", 0, ""), ("model_max_length", 4, ""), ("max_train_examples", 1, " (training pairs)"),
           ("vocab_size", 300, " for a byte-level BPE"), ("max_val_batches", 1, ""),
           ("keep_checkpoints", 1, " (checkpoints kept)"), ("checkpoint_every", 1, " (optimizer steps)"),
           ("max_restarts", 0, ""), ("micro_batches", 1, " (micro-batches per batch)"),
           ("trace_steps", 1, " (training steps the trace keeps)"),
           ("virtual_stages", 1, " (model chunks per pipeline rank)"))


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which option to change and how."""


def option(default: Any, help: str, *, group: str, choices: tuple | None = None, metavar: str | None = None,
           every_run: bool | None = None):
    """A field of the option table, which is also the command-line option ``--<field name>``.

    Args:
        default: the value without the option (None: decided later, e.g. from torchrun).
        help: what it is, with its unit.
        group: the ``--help`` section (one of :data:`GROUPS` for the table's options).
        choices: the allowed values.
        metavar: how ``--help`` names the value.
        every_run: whether every command takes it (default: its section is one of :data:`EVERY_RUN`); else a
            command takes it only by naming it in its ``takes``.
    """
    every = group in EVERY_RUN if every_run is None else every_run
    return field(default=default, metadata={"help": help, "group": group, "choices": choices, "metavar": metavar,
                                            "every_run": every})


def _kind(f: dataclasses.Field) -> type:
    text = str(f.type).replace(" ", "")
    base = text.replace("|None", "").replace("None|", "")
    return {"int": int, "float": float, "str": str, "bool": bool}[base]


def table_field(name: str) -> dataclasses.Field:
    """The declaration of option ``name`` in the table (:class:`RunConfig`).

    Raises:
        KeyError: no option of that name.
    """
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    if name not in fields:
        raise KeyError(f"--{name} is no option of the table (course.config.RunConfig)")
    return fields[name]


def options_in(*groups: str) -> tuple[str, ...]:
    """The options of the table in these ``--help`` sections (:data:`GROUPS`), in the table's order."""
    return tuple(f.name for f in dataclasses.fields(RunConfig) if f.metadata["group"] in groups)


def add_option(parser, name: str, *, default: Any = dataclasses.MISSING, nargs: str | None = None,
               note: str | None = None, choices: tuple | None = None, **argparse_keywords):
    """Add option ``--name`` of the table to ``parser`` (an ``argparse`` parser or argument group) as the table
    declares it — type, help, choices, metavar — for a command that is no :class:`RunConfig` (a benchmark):
    ``default`` replaces the table's default, ``nargs`` (``"+"``) takes a list of values (a sweep), ``note`` is
    added to the help, ``choices`` replaces the table's; ``argparse_keywords`` (``required``, ``type``) go to
    ``add_argument`` as they are.

    Raises:
        KeyError: no option of that name in the table.
    """
    f = table_field(name)
    meta = f.metadata
    value = f.default if default is dataclasses.MISSING else default
    help_text = meta["help"] + (f" ({note})" if note else "")
    if _kind(f) is bool:
        return parser.add_argument(f"--{name}", action="store_true", help=help_text)
    keywords = {"type": _kind(f), "default": value, "nargs": nargs,
                "choices": meta["choices"] if choices is None else choices, "help": help_text,
                "metavar": meta["metavar"], **argparse_keywords}
    return parser.add_argument(f"--{name}", **keywords)


@dataclass
class RunConfig:
    """The option table, and the options every run takes. A command's configuration subclasses it.

    Attributes (command-line options of the same name): see each field's help; the mesh sizes
    ``dp, pp, tp, cp, ep`` give :attr:`dims`; ``micro_batches`` is the number of micro-batches
    each dp rank's share of a batch is cut into; ``virtual_stages`` the model chunks per pipeline
    rank (interleaved 1F1B).
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
    tp: int | None = option(1, "tensor-parallel ranks (per pipeline stage)", group="mesh")
    cp: int | None = option(1, "context-parallel ranks (each holds a part of every sequence)", group="mesh")
    ep: int | None = option(1, "expert-parallel ranks (carved out of dp x cp)", group="mesh")
    micro_batches: int = option(1, "micro-batches each dp rank's share of a batch is cut into (micro-batch size = "
                                   "batch_size / (dp x micro_batches))", group="mesh")
    virtual_stages: int | None = option(1, "model chunks (virtual stages) per pipeline rank (interleaved 1F1B)",
                                        group="mesh")
    # ---- pipeline (notebooks/02_pipeline_parallel.ipynb) ----
    schedule: str | None = option(None, "pipeline schedule of the registry (pipeline.SCHEDULES), one process per "
                                        "stage", group="pipeline")
    single_process: str | None = option(None, "run every stage in this process: pipe = the Pipe, micro-batches on "
                                              "the clock-cycle schedule, a thread per stage; sequential = the whole "
                                              "batch through one stage after another", group="pipeline",
                                        choices=("pipe", "sequential"))
    balance: str = option("count", "layers per stage: count = blocks spread evenly (embeddings on the first, head on "
                                   "the last stage); auto = from each layer's measured forward+backward time, the LM "
                                   "head's included", group="pipeline", choices=("count", "auto"))
    # ---- tensor parallelism (notebooks/03_tensor_parallel.ipynb) ----
    sequence_parallel: bool = option(False, "also split layer norms and dropout along the sequence (Korthikanti et "
                                            "al. 2022)", group="tensor parallelism")
    block_types: str = option("tp", "tp, spd or parallel: one for every layer, or one per layer comma-separated",
                              group="tensor parallelism")
    # ---- 3D parallelism (notebooks/06_3d_parallelism.ipynb) ----
    scatter_gather: bool = option(False, "send 1/tp of each activation between stages and all-gather it in the tp "
                                         "group", group="3D parallelism")
    max_grad_norm: float = option(1.0, "clip the global gradient norm to this", group="3D parallelism")
    # ---- context parallelism (notebooks/07_context_parallelism.ipynb) ----
    attention: str = option("ring", "ring attention (K/V blocks travel the ring) or Ulysses (all-to-all to heads)",
                            group="context parallelism", choices=("ring", "ulysses"))
    layout: str | None = option(None, "which chunks of a sequence each rank holds: zigzag (the ring's default; "
                                      "balances causal work) or contiguous (Ulysses always)",
                                group="context parallelism", choices=("zigzag", "contiguous"))
    seq_len: int = option(1024, "tokens per training sequence (context parallelism: packed pairs)",
                          group="context parallelism")
    block_size: int = option(128, "ring: tile size of the blockwise attention (tokens)", group="context parallelism")
    # ---- mixture of experts (notebooks/08_mixture_of_experts.ipynb) ----
    num_experts: int = option(4, "experts per MoE layer", group="mixture of experts")
    top_k: int = option(2, "experts per token (1: Switch Transformer; 2: GShard, Mixtral)", group="mixture of experts")
    capacity_factor: float | None = option(None, "expert capacity = ceil(factor * tokens * top_k / experts), the rest "
                                                 "dropped (default: dropless)", group="mixture of experts")
    no_normalize_gates: bool = option(False, "top-k > 1: keep the softmax probabilities as gates instead of normalising "
                                             "them to sum to 1 (top-1 gates are always the probability, as in Switch "
                                             "Transformer)", group="mixture of experts")
    aux_loss_coef: float = option(0.01, "load-balancing loss weight (Switch: 0.01)", group="mixture of experts")
    z_loss_coef: float = option(0.001, "router z-loss weight (ST-MoE: 0.001)", group="mixture of experts")
    router: str = option("softmax", "softmax: top-k softmax gating; deepseek: DeepSeek-V3's sigmoid gating with a "
                                    "selection bias, group-limited routing and the sequence-wise balance loss "
                                    "(weighted by --aux_loss_coef)", group="mixture of experts",
                         choices=("softmax", "deepseek"))
    shared_experts: int = option(0, "shared experts every token passes through besides its routed ones (DeepSeekMoE)",
                                 group="mixture of experts")
    router_bias_update: float = option(0.0, "--router deepseek: auxiliary-loss-free balancing, the selection bias "
                                            "moves by this gamma after each step (DeepSeek-V3: 0.001; 0: off)",
                                       group="mixture of experts")
    n_group: int = option(1, "--router deepseek: the experts form this many groups (nodes)", group="mixture of experts")
    topk_group: int = option(1, "--router deepseek: groups each token may route to (node-limited routing)",
                             group="mixture of experts")
    routed_scaling_factor: float | None = option(None, "--router deepseek: the routed experts' gates are multiplied "
                                                       "by it (default: 2.5 with --router deepseek, DeepSeek-V3's "
                                                       "released configuration; 1 with softmax)",
                                                 group="mixture of experts")
    moe_every: int = option(2, "one MoE block in this many (blocks 1, 3, ... for 2)", group="mixture of experts")
    dense: bool = option(False, "train the dense GPT-2 of the same active parameters per token instead (same batches)",
                         group="mixture of experts")
    # ---- gradient communication of a data-parallel run ----
    bucket_mb: float | None = option(None, "average gradients in buckets of this many MB (communication."
                                           "BucketedReducer) instead of one all-reduce per parameter after the "
                                           "backward pass (default with --overlap: 25)", group=COMMUNICATION)
    overlap: bool = option(False, "start each bucket's all-reduce during the backward pass, as soon as it is full",
                           group=COMMUNICATION)
    compression: str = option("none", "topk: top-k sparsification with error feedback; powersgd: rank "
                                      "--powersgd_rank PowerSGD", group=COMMUNICATION,
                              choices=("none", "topk", "powersgd"))
    topk_ratio: float = option(0.01, "--compression topk: fraction of entries sent", group=COMMUNICATION)
    powersgd_rank: int = option(1, "--compression powersgd: matrix rank", group=COMMUNICATION)
    # ---- memory of a data-parallel run ----
    zero: int = option(0, "ZeRO stage: 0 plain data parallelism, 1 optimizer state sharded over the ranks, 2 also "
                          "gradients, 3 also parameters (FSDP, each GPT-2 block a unit)", group=MEMORY,
                       choices=(0, 1, 2, 3))
    hsdp: int = option(1, "hybrid sharding with --zero 3: the dp ranks as REPLICAS x (dp / REPLICAS); ZeRO-3 inside "
                          "each group of dp / REPLICAS neighbouring ranks, its gradient slices averaged across the "
                          "REPLICAS groups (1: ZeRO-3 over all ranks)", group=MEMORY, metavar="REPLICAS")
    zeropp: str = option("", "ZeRO++ with --zero 3, a comma list of qwz (int8 blockwise weight all-gather), hpz "
                             "(backward all-gather inside groups of --zeropp_group ranks), qgz (int8 gradient "
                             "all-to-all) (memory/zeropp.py)", group=MEMORY, metavar="LIST")
    zeropp_group: int = option(0, "--zeropp hpz: ranks per node-sized group, a divisor of --dp (0: the ranks on one "
                                  "node, torchrun's LOCAL_WORLD_SIZE, else --dp)", group=MEMORY, metavar="RANKS")
    activation_checkpointing: bool = option(False, "recompute each GPT-2 block's activations in the backward pass",
                                            group=MEMORY)
    precision: str = option("fp32", "bf16: autocast the forward/backward to bfloat16; weights, gradient reductions "
                                    "and Adam stay fp32", group=MEMORY, choices=("fp32", "bf16"))
    # ---- model shape ----
    n_layer: int | None = option(None, "transformer blocks of the model (default: the preset's)", group="model shape")
    # ---- run ----
    workdir: str = option("workdir", "where results, translations, checkpoints and the tokenizer go", group="run")
    overwrite: bool = option(False, "replace this mode's results already in --workdir (without it, the run "
                                    "refuses to start)", group="run")
    device: str = option("auto", "auto: CUDA with one GPU per local rank when there are enough, else CPU",
                         group="run", choices=("auto", "cpu", "cuda"))
    backend: str = option("auto", "auto: nccl on CUDA, gloo on CPU", group="run", choices=("auto", "gloo", "nccl"))
    timeout: float = option(3600.0, "wall-clock limit of the whole run (seconds)", group="run")
    quiet: bool = option(False, "no progress bar", group="run")
    # ---- fault tolerance (notebooks/11_training_through_failures.ipynb) ----
    replicas: int | None = option(None, "replica groups, each a full replica of the model on --dp ranks (default: "
                                        "one per device, else 2)", group=FAULT_TOLERANCE)
    min_replicas: int = option(1, "the fewest replica groups a step may be taken by (the lighthouse's quorum size)",
                               group=FAULT_TOLERANCE)
    quorum_timeout: float = option(60.0, "seconds a group waits for a quorum, a cross-group all-reduce or a peer's "
                                         "state", group=FAULT_TOLERANCE)
    heartbeat_timeout_ms: int = option(2000, "milliseconds without a heartbeat after which the lighthouse drops a "
                                             "group", group=FAULT_TOLERANCE)
    recovery: str = option("heal", "heal: a killed group restarts alone and heals from a live peer; restart_all: "
                                   "every group restarts from its latest checkpoint (stop the world, to compare)",
                           group=DRILL, choices=("heal", "restart_all"))
    kill_group: int | None = option(None, "SIGKILL every rank of this replica group in mid-step ...", group=DRILL,
                                    metavar="G")
    kill_step: int = option(4, "... of this step (after its forward pass)", group=DRILL)
    restart_step: int | None = option(None, "start the killed group again when the others reach this step; they "
                                            "wait there until its ranks are up (default: kill_step + 2; with "
                                            "--recovery heal)", group=DRILL)
    # ---- measurement (course.trace, course.profiler) ----
    trace: str | None = option(None, "write a Chrome/Perfetto trace of the run to FILE: every rank's training steps, "
                                     "forwards and backwards, optimizer steps, communication (group, bytes, peer), "
                                     "evaluation and checkpoints on one clock", group="measurement", metavar="FILE")
    trace_steps: int = option(20, "training steps the trace keeps (the run's last ones; evaluation and checkpoints "
                                  "are all kept)", group="measurement", metavar="N")
    profile: bool = option(False, "torch.profiler trace of 3 training steps (after the first) per rank, "
                                  "<workdir>/<results prefix>rank<r>_torch_profile.json; with --trace also put into "
                                  "its file, on the same clock", group="measurement")
    steps: int | None = option(None, "training steps (in each timed repeat)", group="measurement", every_run=False)
    out: str | None = option(None, "where the JSON report goes", group="measurement", metavar="FILE",
                             every_run=False)
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
    keep_checkpoints: int = option(2, "checkpoints kept (the newest; older ones are removed as new ones are "
                                      "committed): more keep an intact step to resume from if a newer one is damaged",
                                   group="checkpoints and restarts", metavar="K")
    export_hf: str | None = option(None, "after training, write the model and tokenizer as a Hugging Face GPT-2 "
                                         "folder (GPT2LMHeadModel.from_pretrained(DIR))",
                                   group="checkpoints and restarts", metavar="DIR")
    save_checkpoint: bool = option(False, "save the final weights to <workdir>/checkpoint_data_parallel.pt (a "
                                          "torch.save file made from a DCP checkpoint)",
                                   group="checkpoints and restarts", every_run=False)
    elastic: str | None = option(None, "MIN:MAX nodes, as torchrun's --nnodes=MIN:MAX (project/elastic.py sets it): "
                                       "every (re)start continues from the latest checkpoint at the world torchrun "
                                       "gives, each global batch as MAX x nproc_per_node micro-batches accumulated "
                                       "over the ranks (data_parallel/elastic.py)", group="checkpoints and restarts",
                                 metavar="MIN:MAX", every_run=False)

    # What a command says about itself (data, not options).
    description: ClassVar[str] = "a course run"
    results_prefix: ClassVar[str] = ""        # results files: {prefix}rank{r}_results_epoch{e}.json
    takes: ClassVar[tuple[str, ...]] = ("dp",)  # the options beyond every run's that this command takes
    defaults: ClassVar[dict[str, Any]] = {}   # this command's own defaults of options of the table
    choices: ClassVar[dict[str, tuple]] = {}  # this command's own choices of options of the table
    notes: ClassVar[dict[str, str]] = {}      # a sentence this command adds to an option's help
    unlisted: ClassVar[dict[str, tuple]] = {}  # values an option parses (to refuse them with a reason) but --help hides
    world_option: ClassVar[str | None] = "dp"  # a mesh size that defaults to torchrun's WORLD_SIZE (else 2)
    resumes_at_another_world_size: ClassVar[bool] = False  # its checkpoints load at another number of ranks

    def __init_subclass__(cls, **kwargs):
        """A command's ``defaults`` become the defaults of its dataclass fields (the declaration stays the table's:
        help, type, section, choices)."""
        super().__init_subclass__(**kwargs)
        declared = {f.name: f for f in dataclasses.fields(RunConfig)} if dataclasses.is_dataclass(RunConfig) else {}
        own = cls.__dict__.get("__annotations__")
        if own is None:
            own = {}
            cls.__annotations__ = own
        for name, value in cls.__dict__.get("defaults", {}).items():
            if name not in declared:
                raise TypeError(f"{cls.__name__}.defaults names --{name}, which is no option of the table")
            if name in cls.__dict__ and not isinstance(cls.__dict__[name], dataclasses.Field):
                raise TypeError(f"{cls.__name__}: --{name} has a default in defaults and as an attribute; keep one")
            own[name] = declared[name].type
            setattr(cls, name, field(default=value, metadata=declared[name].metadata))

    def export_refusal(self) -> str | None:
        """Why this run cannot ``--export_hf`` (None: it can). Scripts whose model is not a GPT-2 say so."""
        return None

    # ---- building it ---------------------------------------------------------------------------
    @classmethod
    def options(cls) -> list[str]:
        """The options this command takes, in the table's order: every run's, those it names in ``takes``, and any
        it declares itself (a field of its own class, not the table's)."""
        table = {f.name: f.metadata for f in dataclasses.fields(RunConfig)}
        return [f.name for f in dataclasses.fields(cls) if f.metadata and (f.metadata["every_run"] or f.name in cls.takes
                                                                           or f.metadata != table.get(f.name))]

    @classmethod
    def parser(cls, prog: str | None = None) -> argparse.ArgumentParser:
        """The command line made from the table (``--help`` lists the command's options by section, with its own
        defaults, choices and notes); ``prog``: the command its usage and errors name (default: the script's file
        name)."""
        parser = OptionParser(prog=prog, description=cls.description,
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        groups: dict[str, argparse._ArgumentGroup] = {}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        order = {group: i for i, group in enumerate(GROUPS)}
        for name in sorted(cls.options(), key=lambda n: order.get(fields[n].metadata["group"], len(GROUPS))):
            f, meta = fields[name], fields[name].metadata
            group = groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
            notes = [cls.notes[name]] if name in cls.notes else []
            if name == cls.world_option:
                notes.append("default: torchrun's WORLD_SIZE, else 2")
            help_text = meta["help"] + (f" ({'; '.join(notes)})" if notes else "")
            if _kind(f) is bool:
                group.add_argument(f"--{name}", action="store_true", help=help_text)
            else:
                shown, hidden = cls.choices.get(name, meta["choices"]), cls.unlisted.get(name, ())
                group.add_argument(f"--{name}", type=_kind(f), default=f.default, help=help_text,
                                   choices=(*shown, *hidden) if hidden else shown,
                                   metavar="{" + ",".join(map(str, shown)) + "}" if hidden else meta["metavar"])
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
        :mod:`project.tools.modal_support`). ``device`` and ``backend`` are taken as given, not resolved against
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
        """The configuration as results files keep it: the options this command takes, the mesh sizes, and
        ``extra``."""
        keep = set(self.options()) | set(MESH)
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in keep}, **extra}

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
        for name, low, what in MINIMUM:
            value = getattr(self, name)
            if value is not None and value < low:  # (None: an option left out, where that is allowed)
                raise ConfigError(f"--{name} must be >= {low}{what}, not {value}")
        if not self.timeout > 0:  # also refuses nan
            raise ConfigError(f"--timeout must be > 0 seconds (the wall-clock limit of the whole run), not "
                              f"{self.timeout}")
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
        try:
            dims = self.dims
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.check_batch_split()
        for name in (*MESH, "micro_batches", "virtual_stages"):
            if getattr(self, name) > 1 and name not in self.takes:
                sizes = ", ".join("--" + o for o in self.takes if o in (*MESH, "micro_batches", "virtual_stages"))
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

    def check_batch_split(self) -> None:
        """The one rule of a batch's split: every dp rank takes ``batch_size / dp`` rows and cuts them into
        ``micro_batches`` micro-batches of equal size, so ``batch_size`` is a multiple of ``dp x micro_batches``
        (of the two, the sizes this command takes). Raises :class:`ConfigError`."""
        parts = [(name, getattr(self, name)) for name in ("dp", "micro_batches") if name in self.takes]
        rows = 1
        for _, size in parts:
            rows *= size
        if self.batch_size % rows:
            sizes = " x ".join(f"--{name} {size}" for name, size in parts)
            fit = max(rows, self.batch_size // rows * rows)
            raise ConfigError(f"--batch_size {self.batch_size} is not divisible by {sizes}: every dp rank takes "
                              f"batch_size / dp rows, cut into micro_batches micro-batches of equal size (the "
                              f"micro-batch size batch_size / (dp x micro_batches) is a whole number >= 1); try "
                              f"--batch_size {fit}")

    def check_environment(self) -> None:
        """Checks that read the file system, in the parent process before any worker starts: the data
        folder, a cached tokenizer, the work directory (writable; no results of this mode replaced
        without ``--overwrite``), the checkpoint to resume, room for checkpoints. Raises
        :class:`ConfigError`."""
        try:
            check_run_files(self)
        except (ValueError, FileNotFoundError) as exc:  # course.data.DataNotFoundError is a FileNotFoundError
            raise ConfigError(str(exc)) from None
