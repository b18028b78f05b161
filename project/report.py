"""Short summaries of a finished run, printed by the run scripts."""
from __future__ import annotations

import json
from pathlib import Path

from project.launch import in_torchrun
from project.results import results_name


def print_epoch_table(workdir, prefix: str = "", n_epochs: int = 1, rank: int = 0) -> None:
    """Print rank ``rank``'s results per epoch: validation loss, BLEU, time, tokens/s.

    Under torchrun only the process of that rank prints (the others have no file to read yet).
    """
    import os

    if in_torchrun() and int(os.environ["RANK"]) != rank:
        return
    print(f"{'epoch':>5} {'val loss':>9} {'BLEU':>6} {'time (s)':>9} {'tokens/s':>10} {'all ranks tok/s':>16}")
    for epoch in range(n_epochs):
        path = Path(workdir) / results_name(rank, epoch, prefix)
        r = json.loads(path.read_text())
        total = r.get("global_tokens_per_sec", r["tokens_per_sec"])
        print(f"{epoch:>5} {r['validation_loss']:>9.3f} {r['bleu']:>6.2f} {r['training_time']:>9.1f} "
              f"{r['tokens_per_sec']:>10.0f} {total:>16.0f}")
    print(f"results: {Path(workdir).resolve()}/{prefix}rank*_results_epoch*.json")
