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
