"""Splitting an ``nn.Sequential`` into pipeline stages (partitions).

A stage is a run of consecutive layers that live on one device. Two ways to say where
the stage boundaries are:

* by device (torchgpipe's way): a new stage starts wherever the device changes. A
  layer's device is the device of its parameters, or, for a parameterless layer
  (``nn.ReLU``, a reshape), the device of the :class:`WithDevice` wrapper around it.
* by ``balance`` (numbers of layers per stage): needed on a CPU-only machine, where
  every layer is on ``cpu`` and grouping by device would make one single stage.
  ``balance=[2, 2]`` makes two stages of two layers each even though both are on ``cpu``.

Source: Kim et al. 2020, torchgpipe, Sec. 3.1 (partitioning, ``balance``).
"""
from __future__ import annotations

import torch
from torch import nn


class WithDevice(nn.Module):
    """Pin ``module`` to ``device`` for stage placement (a parameterless module has no device of its own).

    ``forward`` calls the wrapped module unchanged. The wrapper is removed when the
    stage is assembled (:func:`_split_module`).
    """

    def __init__(self, module: nn.Module, device: torch.device | str):
        super().__init__()
        self._module = module
        self._device = torch.device(device)

    def forward(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    @property
    def module(self) -> nn.Module:
        return self._module

    @property
    def device(self) -> torch.device:
        return self._device


def _retrieve_device(module: nn.Module) -> torch.device:
    """The device of ``module``: its :class:`WithDevice` device, else its parameters' device, else ``cpu``.

    Raises:
        ValueError: the parameters of ``module`` are on more than one device.
    """
    if isinstance(module, WithDevice):
        return module.device
    devices = {p.device for p in module.parameters()}
    if len(devices) > 1:
        raise ValueError(f"{type(module).__name__} has parameters on several devices {sorted(map(str, devices))}; "
                         "move it to one device with .to(device) or wrap it in WithDevice")
    return devices.pop() if devices else torch.device("cpu")


def _unwrap(module: nn.Module) -> nn.Module:
    """The layer inside a :class:`WithDevice`, moved to that device; other layers unchanged."""
    if isinstance(module, WithDevice):
        return module.module.to(module.device)
    return module


def _check_balance(balance: list[int], n_layers: int) -> None:
    if any((not isinstance(b, int)) or b < 1 for b in balance):
        raise ValueError(f"balance {balance} must hold whole numbers >= 1 (layers per stage)")
    if sum(balance) != n_layers:
        raise ValueError(f"balance {balance} covers {sum(balance)} layers, but the module has {n_layers}")


def _common_device(devices: list[torch.device], stage: int) -> torch.device:
    if len(set(devices)) > 1:
        raise ValueError(f"stage {stage} holds layers on several devices {[str(d) for d in devices]}; "
                         "put every layer of one stage on the same device")
    return devices[0]


def _split_module(modules: nn.Sequential, balance: list[int] | None = None
                  ) -> tuple[list[nn.Sequential], list[torch.device]]:
    """Group the layers of ``modules`` into pipeline stages.

    Args:
        modules: the model as an ``nn.Sequential`` of layers; a layer may be wrapped in
            :class:`WithDevice`.
        balance: layers per stage, e.g. ``[2, 1]`` (sum = number of layers). ``None``:
            consecutive layers on the same device form one stage.

    Returns:
        ``(partitions, devices)``: one ``nn.Sequential`` per stage (with the
        :class:`WithDevice` wrappers removed) and the device of each stage.

    Raises:
        ValueError: a bad ``balance``; the layers of one stage on several devices.
    """
    layers = [module for _, module in modules.named_children()]
    layer_devices = [_retrieve_device(layer) for layer in layers]
    layers = [_unwrap(layer) for layer in layers]
    if balance is not None:
        _check_balance(list(balance), len(layers))
    groups: list[list[nn.Module]] = []
    devices: list[torch.device] = []
    # BEGIN ASSIGN5_2_1
    if balance is None:
        for layer, device in zip(layers, layer_devices):
            if devices and devices[-1] == device:
                groups[-1].append(layer)
            else:
                groups.append([layer])
                devices.append(device)
    else:
        start = 0
        for stage, size in enumerate(balance):
            groups.append(layers[start:start + size])
            devices.append(_common_device(layer_devices[start:start + size], stage))
            start += size
    # END ASSIGN5_2_1
    return [nn.Sequential(*group) for group in groups], devices


def balanced_sizes(n_layers: int, n_stages: int) -> list[int]:
    """Layers per stage, as even as possible (earlier stages take the remainder), e.g. (5, 2) -> [3, 2].

    Raises:
        ValueError: ``n_stages`` < 1 or more stages than layers.
    """
    if n_stages < 1:
        raise ValueError(f"the number of stages must be >= 1, not {n_stages}")
    if n_stages > n_layers:
        raise ValueError(f"{n_stages} stages need at least {n_stages} layers, but the model has {n_layers}; "
                         "use fewer stages")
    base, extra = divmod(n_layers, n_stages)
    return [base + (1 if s < extra else 0) for s in range(n_stages)]


def place(modules: nn.Sequential, devices: list[torch.device | str], balance: list[int] | None = None
          ) -> tuple[nn.Sequential, list[int]]:
    """Put stage ``s`` of ``modules`` on ``devices[s]``; every layer is wrapped in :class:`WithDevice`.

    ``devices`` may repeat a device (``["cpu", "cpu"]``: two stages on one CPU). Without
    ``balance`` the layers are spread as evenly as possible (:func:`balanced_sizes`).

    Returns:
        ``(placed, balance)`` to pass on to :func:`_split_module`.
    """
    layers = list(modules.children())
    balance = list(balance) if balance is not None else balanced_sizes(len(layers), len(devices))
    _check_balance(balance, len(layers))
    if len(balance) != len(devices):
        raise ValueError(f"balance {balance} has {len(balance)} stages but {len(devices)} devices were given")
    placed, start = [], 0
    for size, device in zip(balance, devices):
        device = torch.device(device)
        placed += [WithDevice(layer.to(device), device) for layer in layers[start:start + size]]
        start += size
    return nn.Sequential(*placed), balance


def linear_partition(costs: list[float], n_parts: int) -> list[int]:
    """Split ``costs`` (one per layer, in chain order) into ``n_parts`` contiguous runs of at
    least one layer, minimising the largest run's sum — the classic linear-partition problem,
    solved exactly by dynamic programming in O(n^2 * n_parts).

    ``best[k][j]`` is the smallest achievable maximum when the first ``j`` layers form ``k``
    parts: ``min over i of max(best[k - 1][i], sum(costs[i:j]))``. Among equal optima the
    one with the earliest cuts is returned.

    Returns:
        layers per part (``balance``), e.g. ``linear_partition([1, 1, 1, 3], 2) == [3, 1]``.

    Raises:
        ValueError: ``n_parts`` < 1 or more parts than layers; a negative cost.

    Source: Skiena, The Algorithm Design Manual, Sec. 10.7 (the partition problem);
    used for pipeline stages by torchgpipe's ``balance_by_time`` (Kim et al. 2020, Sec. 3.3).
    """
    n = len(costs)
    if n_parts < 1 or n_parts > n:
        raise ValueError(f"cannot split {n} layers into {n_parts} stages of at least one layer each; "
                         f"use between 1 and {n} stages")
    if any(c < 0 for c in costs):
        raise ValueError(f"layer costs must be >= 0, got {costs}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(n_parts + 1)]
    cut = [[0] * (n + 1) for _ in range(n_parts + 1)]
    best[0][0] = 0.0
    for k in range(1, n_parts + 1):
        for j in range(k, n - (n_parts - k) + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                if value < best[k][j] - 1e-12 * max(1.0, abs(value)):
                    best[k][j], cut[k][j] = value, i
    sizes, j = [], n
    for k in range(n_parts, 0, -1):
        i = cut[k][j]
        sizes.append(j - i)
        j = i
    return sizes[::-1]


def measure_layer_costs(layers: nn.Sequential, sample_input: torch.Tensor, loss_fn=None, repeats: int = 3,
                        warmup: int = 1, clock: str = "auto") -> list[float]:
    """Seconds of one forward + backward of each layer of ``layers`` on ``sample_input`` (the fastest of
    ``repeats`` after ``warmup`` untimed runs: on a shared machine the other processes only ever add
    time, so the minimum is the layer's own cost), on the device the layers are on, with this
    process's threads.

    Layer ``j`` is timed on the output of layers ``0 .. j - 1`` (detached, requiring grad if
    floating point), back-propagating a gradient of ones of its output's shape. The last
    layer's time includes ``loss_fn(output)`` and its backward if ``loss_fn`` is given —
    for GPT-2 the last layer is the final layer norm and the LM head (the largest matrix
    of the model), so its cost belongs to the last stage (:func:`linear_partition`).

    ``clock``: ``"wall"`` (``time.perf_counter``), ``"cpu"`` (``time.process_time``: this
    process's CPU seconds, which leave out the time it waited for a core while other ranks
    ran — the right cost when a machine runs more ranks than it has cores), or ``"auto"``:
    ``"cpu"`` on a CPU device with one thread per process (so CPU seconds are the compute's own
    seconds), else ``"wall"`` (a GPU computes asynchronously of the host's CPU clock).

    Raises:
        ValueError: ``repeats`` < 1; an unknown ``clock``.
    """
    import time

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if clock not in ("auto", "wall", "cpu"):
        raise ValueError(f"clock must be 'auto', 'wall' or 'cpu', got {clock!r}")
    if clock == "auto":
        clock = "cpu" if sample_input.device.type == "cpu" and torch.get_num_threads() == 1 else "wall"
    now = time.process_time if clock == "cpu" else time.perf_counter
    layers = list(layers)
    costs = []
    h = sample_input
    for j, layer in enumerate(layers):
        x = h.detach().requires_grad_() if h.is_floating_point() else h
        times = []
        for r in range(warmup + repeats):
            if x.is_cuda:  # course.measure: the clock is read once the device's queued work has run
                torch.cuda.synchronize(x.device)
            start = now()
            y = layer(x)
            if j == len(layers) - 1 and loss_fn is not None:
                loss_fn(y).backward()
            elif y.requires_grad:
                y.backward(torch.ones_like(y))
            if y.is_cuda:
                torch.cuda.synchronize(y.device)
            if r >= warmup:
                times.append(now() - start)
        for p in layer.parameters():
            p.grad = None
        costs.append(min(times))
        with torch.no_grad():
            h = layer(x)
    return costs


# The public name; ``_split_module`` is the name of assignment 5.2.1 (torchgpipe's).
split_module = _split_module
