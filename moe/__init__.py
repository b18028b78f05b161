"""Assignment 5.8: mixture of experts and expert parallelism (Shazeer et al. 2017; Lepikhin et al. 2020,
GShard; Fedus et al. 2021, Switch Transformer; Zoph et al. 2022, ST-MoE; Jiang et al. 2024, Mixtral;
DeepSeek-AI 2024, DeepSeek-V3).

* :mod:`moe.config` — :class:`MoEConfig`: experts, top-k, capacity factor, loss weights, checked early.
* :mod:`moe.router` — top-k softmax gating (a5_8_1).
* :mod:`moe.deepseek_router` — DeepSeek-V3's sigmoid gating, selection bias and its update, group-limited
  routing, shared experts, sequence-wise balance loss (a5_8_4).
* :mod:`moe.capacity` — expert capacity and token dropping (a5_8_1).
* :mod:`moe.losses` — the load-balancing loss and the router z-loss (a5_8_1).
* :mod:`moe.permutation` — tokens grouped by expert, and the gate-weighted combine (a5_8_1).
* :mod:`moe.experts` — the experts as stacked weights (GPT-2 MLPs, Mixtral's SwiGLU).
* :mod:`moe.layer` — :class:`MoELayer`, single-process or expert parallel.
* :mod:`moe.all_to_all` — the all-to-all with its backward pass (a5_8_2).
* :mod:`moe.expert_parallel` — count exchange, dispatch and combine over the ep group (a5_8_2).
* :mod:`moe.gradients` — dense gradients over dp × cp, expert gradients over their replicas (a5_8_3).
* :mod:`moe.gpt2` — GPT-2 with MoE MLPs in every other block, and the dense model it is compared with.
* :mod:`moe.training` — the training mode of ``project/run_moe.py``.
* :mod:`moe.labs.experiments`, :mod:`moe.labs.checks` — notebook workers and exercise checks.

Every collective takes its group (the ep group for tokens; the dp × cp and edp groups for gradients)
through :mod:`course.collectives`, so it is counted. Importing this package does not import
``transformers``.
"""
from course.environment import torch_installed
from moe.config import MoEConfig

if torch_installed():  # without torch (modal run on a laptop) only the configuration above loads
    from moe.gpt2 import DenseGPT2, MoEGPT2, moe_block_indices, parameter_counts
    from moe.gradients import sync_moe_gradients
    from moe.layer import MoELayer, MoEOutput

__all__ = ["MoEConfig", "MoELayer", "MoEOutput", "MoEGPT2", "DenseGPT2", "moe_block_indices", "parameter_counts",
           "sync_moe_gradients"]
