"""The shared epoch runner's train loop: the progress bar must not change which batches a rank sees."""
import torch
from torch.utils.data import DataLoader

from course.epoch_runner import supervised_step, train_epoch


def run(show_progress):
    seen = []
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(m, batch):
        seen.append(batch["x"].flatten().tolist())
        return m(batch["x"].float()).sum()

    data = [{"x": torch.tensor([i]), "attention_mask": torch.ones(1)} for i in range(24)]
    loader = DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    stats = train_epoch(lambda batch: supervised_step(model, optimizer, batch, "cpu", loss_fn=loss_fn), loader, 5,
                        show_progress=show_progress)
    return seen, stats


def test_progress_bar_leaves_the_batch_order_alone():
    quiet, stats = run(False)
    shown, _ = run(True)
    assert quiet == shown
    assert stats["steps"] == 5 and stats["tokens"] == 20 and len(stats["losses"]) == 5
