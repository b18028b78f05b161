"""GPT-2 with mixture-of-experts MLPs, expert parallel × data parallel, on Multi30k German→English (assignment 5.8).

    python project/run_moe.py                                        # dp 2, ep 2, 4 experts, top-2, dropless
    python project/run_moe.py --dp 4 --ep 2 --num_experts 8 --top_k 1 --capacity_factor 1.25
    python project/run_moe.py --dp 2 --dense --top_k 2               # the dense GPT-2 of the same active parameters
    python project/run_moe.py --router deepseek --shared_experts 1 --router_bias_update 0.001   # DeepSeek-V3 routing
    torchrun --standalone --nproc_per_node=4 project/run_moe.py --dp 4 --ep 4

Starts ``--dp`` processes (gloo on the CPU, NCCL with one GPU each) or joins the group torchrun
made. Every other block's MLP is an MoE layer of ``--num_experts`` GPT-2 MLPs, each token routed to
``--top_k`` of them; the experts are shared out over ``--ep`` ranks (tokens travel to them by
all-to-all), dense gradients are averaged over the dp group and each expert's over its replicas
(``moe.gradients``). Writes ``<workdir>/moe_rank{r}_results_epoch{e}.json`` (with what the routers
did at every step, the collectives per step by group and the parameter counts) and
``moe_translations_epoch{e}.json``.
"""
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from project.options.run_moe import MoERunConfig  # noqa: E402,F401  (imported from here too)
from project.train import mode_command  # noqa: E402

parse_args, main = mode_command("moe")  # this command is project/train.py --mode moe

if __name__ == "__main__":
    sys.exit(main())
