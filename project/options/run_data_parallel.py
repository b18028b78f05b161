"""The configuration of ``project/run_data_parallel.py`` (torch-free: the script, ``modal run`` and the tests
import it)."""
from __future__ import annotations

from dataclasses import dataclass

from course.config import COMMUNICATION, MEMORY, ZEROPP, ConfigError, RunConfig, options_in
from course.environment import in_torchrun


def zeropp_parts(zero: int, text: str | None) -> tuple[str, ...]:
    """``--zeropp`` as a tuple of names (``()`` without it or without ``--zero 3``)."""
    return tuple(n.strip().lower() for n in (text or "").split(",") if n.strip()) if zero == 3 else ()


def node_group_size(dp: int, requested: int, ranks_per_node: int) -> int:
    """dp ranks per hpZ group: ``requested`` (``--zeropp_group``) if given, else the most dp ranks on one node of
    ``ranks_per_node`` that divide dp."""
    if requested:
        return requested
    g = max(1, min(dp, ranks_per_node))
    while dp % g:
        g -= 1
    return g


@dataclass
class DataParallelConfig(RunConfig):
    """``project/run_data_parallel.py``: data parallelism over ``--dp`` processes, with the gradient
    communication of part 5.4 or the memory techniques of part 5.5."""

    description = "Data-parallel GPT-2 training on Multi30k German→English (assignment 5.1)."
    takes = ("dp", "save_checkpoint", "elastic", *options_in(COMMUNICATION, MEMORY))
    defaults = {"dp": None}
    world_option = "dp"
    resumes_at_another_world_size = True  # data_parallel/data_order.py; ZeRO: memory/sharded_checkpoint.py

    def check(self) -> None:
        super().check()
        if self.hsdp < 1 or self.dp % self.hsdp:
            raise ConfigError(f"--hsdp {self.hsdp} must be a number of replicas that divides --dp {self.dp} (the dp ranks "
                              f"are laid out as replicas x shard); try --hsdp {2 if self.dp % 2 == 0 else 1}")
        if self.hsdp > 1 and self.zero != 3:
            raise ConfigError(f"--hsdp {self.hsdp} shards with ZeRO-3 inside each group of {self.dp // self.hsdp} ranks: "
                              "also give --zero 3")
        self.check_zeropp()
        if self.bucket_mb is not None and self.bucket_mb <= 0:
            raise ConfigError(f"--bucket_mb must be > 0 (MB per bucket), not {self.bucket_mb}; try --bucket_mb 25")
        if not 0 < self.topk_ratio <= 1:
            raise ConfigError(f"--topk_ratio must be in (0, 1] (fraction of gradient entries sent), "
                              f"not {self.topk_ratio}")
        if self.powersgd_rank < 1:
            raise ConfigError(f"--powersgd_rank must be >= 1, not {self.powersgd_rank}")
        if self.compression != "none" and (self.bucket_mb is not None or self.overlap):
            raise ConfigError(f"--compression {self.compression} sends its own compressed messages per tensor: "
                              "drop --bucket_mb/--overlap, or use --compression none")
        memory, comm = self.memory_options(), self.communication_options()
        if memory and comm:
            raise ConfigError(f"{', '.join(memory)} run the memory part's training step, which does its own gradient "
                              f"communication; drop {', '.join(comm)} (notebook 04's options), or the memory options")
        if self.elastic is not None:
            check_elastic(self, memory + comm)

    def memory_options(self) -> list[str]:
        """The memory part's options given (``--zero``, ``--activation_checkpointing``, ``--precision bf16``; ``--hsdp``
        and ``--zeropp`` need ``--zero 3``): the run trains with :func:`memory.build_sharding`'s sharded step."""
        return [o for o, on in (("--zero", self.zero), ("--activation_checkpointing", self.activation_checkpointing),
                                ("--precision bf16", self.precision != "fp32")) if on]

    def communication_options(self) -> list[str]:
        """The communication part's options given (``--bucket_mb``, ``--overlap``, ``--compression``): the run
        averages gradients with :func:`communication.build_grad_sync`'s synchroniser."""
        return [o for o, on in (("--bucket_mb", self.bucket_mb is not None), ("--overlap", self.overlap),
                                ("--compression", self.compression != "none")) if on]

    def zeropp_options(self) -> tuple[str, ...]:
        """``--zeropp`` as a tuple of names (``()`` without it)."""
        return zeropp_parts(3, self.zeropp)

    def hpz_group_size(self) -> int:
        """Ranks per hpZ group: ``--zeropp_group``, else the most of torchrun's ``LOCAL_WORLD_SIZE`` (one node's
        ranks; without it, --dp) that divide --dp."""
        import os

        local = int(os.environ.get("LOCAL_WORLD_SIZE", 0) or 0) or self.dp
        return node_group_size(self.dp, self.zeropp_group, local)

    def check_zeropp(self) -> None:
        names = self.zeropp_options()
        unknown = [n for n in names if n not in ZEROPP]
        if unknown:
            raise ConfigError(f"--zeropp {self.zeropp}: unknown {', '.join(unknown)}; give a comma list of "
                              f"{', '.join(ZEROPP)}, e.g. --zeropp qwz,hpz,qgz")
        if names and self.zero != 3:
            raise ConfigError(f"--zeropp {self.zeropp} changes ZeRO-3's communication: also give --zero 3")
        if names and self.hsdp > 1:
            raise ConfigError(f"--zeropp and --hsdp {self.hsdp} are two layouts of the ranks: drop one of them")
        if self.zeropp_group < 0 or (self.zeropp_group and self.dp % self.zeropp_group):
            raise ConfigError(f"--zeropp_group {self.zeropp_group} must divide --dp {self.dp} (ranks per node-sized "
                              f"group); try --zeropp_group {2 if self.dp % 2 == 0 else 1}")

    def resolve(self, devices: int | None = None, *, here: bool = True) -> None:
        super().resolve(devices, here=here)
        if self.elastic is not None and self.resume is None and in_torchrun():
            from course.checkpoint import checkpoint_root, latest_checkpoint

            if latest_checkpoint(checkpoint_root(self.workdir, self.results_prefix)) is not None:
                self.resume = "latest"  # every (re)start of an elastic run continues the run

    def check_environment(self) -> None:
        super().check_environment()
        if self.resume is not None:
            check_resume_layout(self)



def check_elastic(config: DataParallelConfig, other_options: list[str], nproc_per_node: int | None = None) -> None:
    """``--elastic MIN:MAX``: bounds torchrun can have, a checkpoint to continue from, plain data parallelism, and a
    global batch that splits into ``MAX x nproc_per_node`` micro-batches. The training checks it under torchrun
    (``nproc_per_node``: its ``LOCAL_WORLD_SIZE``; the world must lie inside the bounds); ``project/elastic.py``
    checks it before it starts torchrun (``nproc_per_node`` given).

    Raises:
        ConfigError: naming what to change.
    """
    import os

    from course.elastic import parse_nnodes

    try:
        low, high = parse_nnodes(config.elastic)
    except ValueError as exc:
        raise ConfigError(str(exc).replace("--nnodes", "--elastic")) from None
    if not config.checkpoint_every:
        raise ConfigError("an elastic run continues from the latest checkpoint whenever the world changes: also give "
                          "--checkpoint_every N")
    if other_options:
        raise ConfigError(f"an elastic run trains with plain data parallelism (gradients averaged, micro-batches "
                          f"accumulated); drop {', '.join(other_options)}")
    if config.max_restarts:
        raise ConfigError("an elastic run's workers are restarted by torchrun: give --max_restarts to "
                          "project/elastic.py, not to the training")
    if nproc_per_node is None:
        if not in_torchrun():
            raise ConfigError("--elastic is what project/elastic.py passes to its torchrun workers: start an elastic "
                              "run with python project/elastic.py --nnodes MIN:MAX ... --mode dp ...")
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            raise ConfigError("--elastic needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's environment "
                              "(project/elastic.py sets it): the agents' shared store keeps its keys across rendezvous "
                              "rounds, and once a node has joined the agents' restart counts differ")
        nproc_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        nodes = int(os.environ["WORLD_SIZE"]) // nproc_per_node
        if not low <= nodes <= high:
            raise ConfigError(f"torchrun started {nodes} node(s), outside --elastic {config.elastic}: give torchrun "
                              f"the same --nnodes {config.elastic}")
    micro = high * nproc_per_node
    if config.batch_size % micro:
        raise ConfigError(f"--batch_size {config.batch_size} does not split into {micro} micro-batches (MAX {high} "
                          f"nodes x {nproc_per_node} ranks each: one per rank of the largest world); try --batch_size "
                          f"{max(micro, config.batch_size // micro * micro)}")


def check_resume_layout(config: DataParallelConfig) -> None:
    """The checkpoint to resume holds the state of this run's kind: plain data parallelism (any --zero 0 run),
    ZeRO-1/2 (one flat buffer), or ZeRO-3 (its units; with or without --hsdp) — each at any --dp.

    Raises:
        ConfigError: naming the --zero to resume with.
    """
    from course.checkpoint import checkpoint_root, resolve_resume
    from memory.sharded_checkpoint import FAMILIES, ZERO_FLAT, ZERO_UNITS, checkpoint_family

    path = resolve_resume(config.resume, checkpoint_root(config.workdir, config.results_prefix))
    family = checkpoint_family(path)
    mine = ZERO_UNITS if config.zero == 3 else ZERO_FLAT if config.zero in (1, 2) else "model"
    if family is not None and family != mine:
        raise ConfigError(f"--resume {config.resume}: the checkpoint holds the state of a {FAMILIES[family]} run, this "
                          f"run has --zero {config.zero}; resume with {FAMILIES[family]} (at any --dp)")
