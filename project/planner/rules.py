"""The planner's rules on a configuration, checked before anything is predicted (:class:`course.config.ConfigError`
names the option to change)."""
from __future__ import annotations

from course.config import ConfigError


def check_plan(config) -> None:
    """Every rule of a plan beyond :meth:`course.config.RunConfig.check` (called by ``PlanConfig.check``)."""
    from pipeline.schedules import SCHEDULES, micro_batches_per_round

    from project.planner.model import COURSE_PRESETS

    model = config.model
    if config.top < 1:
        raise ConfigError(f"--top must be >= 1 plans, not {config.top}")
    if config.flops_efficiency is not None and not 0 < config.flops_efficiency <= 1:
        raise ConfigError(f"--flops_efficiency is a fraction of the peak in (0, 1], not {config.flops_efficiency}")
    if config.steps < 1:
        raise ConfigError(f"--steps must be >= 1, not {config.steps}")
    if config.activation_checkpointing and config.selective_checkpointing != "none":
        raise ConfigError(f"--activation_checkpointing recomputes every block already: drop --selective_checkpointing "
                          f"{config.selective_checkpointing}")
    if config.norm_kernel == "composite" and model.norm != "rmsnorm":
        raise ConfigError(f"--norm_kernel composite is RMSNorm written as PyTorch operations: --preset {config.preset} "
                          f"has a {model.norm}, one kernel (--norm_kernel fused)")
    if config.precision == "fp32" and config.reduce_dtype == "bf16":
        raise ConfigError("--reduce_dtype bf16 with --precision fp32: the gradients are fp32; use --reduce_dtype fp32 "
                          "or auto")
    if (config.measure or config.verify) and (config.shape_overrides or config.preset not in COURSE_PRESETS):
        raise ConfigError(f"--measure and --verify build the course's GPT-2 presets {COURSE_PRESETS}: drop the free "
                          f"shape options and choose one of them")
    if config.tp % model.n_kv_head and model.n_kv_head % config.tp:
        raise ConfigError(f"--tp {config.tp} and the {model.n_kv_head} key/value heads: one must divide the other "
                          f"(each rank holds whole key/value heads, replicated when tp exceeds them)")
    if config.ranking:
        if config.n_devices % (config.cp * config.ep):
            raise ConfigError(f"--n_devices {config.n_devices} is not a multiple of --cp {config.cp} x --ep {config.ep}")
        return
    if config.verify:
        raise ConfigError("--verify checks the ranked plans: give --n_devices without --dp --pp --tp")
    try:
        config.dims.check(config.devices, n_layer=model.n_layer, n_head=model.n_head, n_inner=model.n_inner)
    except ValueError as exc:
        raise ConfigError(f"{exc} (--n_devices {config.devices})") from None
    per_dp = config.batch_size // config.dp
    if config.batch_size % config.dp or per_dp % config.micro_batches:
        raise ConfigError(f"--batch_size {config.batch_size} must split into --dp {config.dp} shares of --micro_batches "
                          f"{config.micro_batches} micro-batches: try --batch_size "
                          f"{config.dp * config.micro_batches * max(1, per_dp // config.micro_batches)}")
    if config.model_max_length % config.cp:
        raise ConfigError(f"--cp {config.cp} does not divide the sequence length --model_max_length "
                          f"{config.model_max_length}")
    chunked = SCHEDULES[config.schedule].interleaved
    if config.virtual_stages > 1 and not chunked:
        raise ConfigError(f"--virtual_stages {config.virtual_stages} needs --schedule interleaved")
    if chunked and config.pp > 1:
        try:
            micro_batches_per_round(config.pp, config.micro_batches)
        except ValueError as exc:
            raise ConfigError(f"--micro_batches {config.micro_batches}: {exc}") from None
    if config.pp * config.virtual_stages > model.n_layer:
        raise ConfigError(f"--pp {config.pp} x --virtual_stages {config.virtual_stages} is more than the "
                          f"{model.n_layer} blocks of --preset {config.preset}")
    if config.ep > 1 and (config.num_experts < 2 or config.num_experts % config.ep):
        raise ConfigError(f"--ep {config.ep} shares out the experts of MoE layers: give --num_experts, a multiple of "
                          f"{config.ep} (now {config.num_experts})")
    if config.num_experts > 1 and not 1 <= config.top_k <= config.num_experts:
        raise ConfigError(f"--top_k must be in 1..--num_experts {config.num_experts}, not {config.top_k}")
    check_zeropp(config)
    if config.measure:
        if config.hardware != "cpu":
            raise ConfigError("--measure runs the configuration on this machine's CPU: add --hardware cpu")
        from project.planner.measure import measurable

        why = measurable(config)
        if why:
            raise ConfigError(f"--measure: {why}")


def check_zeropp(config) -> None:
    """``--zeropp`` names ZeRO++'s parts with ``--zero 3``; ``--zeropp_group`` divides dp."""
    from project.options.run_data_parallel import ZEROPP

    parts = tuple(n.strip().lower() for n in (config.zeropp or "").split(",") if n.strip())
    if [n for n in parts if n not in ZEROPP] or (parts and config.zero != 3):
        raise ConfigError(f"--zeropp {config.zeropp}: a comma list of {', '.join(ZEROPP)}, with --zero 3")
    if config.zeropp_group < 0 or (config.zeropp_group and config.dp % config.zeropp_group):
        raise ConfigError(f"--zeropp_group {config.zeropp_group} must divide --dp {config.dp}")
