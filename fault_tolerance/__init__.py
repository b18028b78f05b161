"""Training through failures: per-step fault tolerance across replica groups (torchft), DiLoCo (assignment 5.1.4),
and the arithmetic of failures at scale. See notebooks/11_training_through_failures.ipynb."""
