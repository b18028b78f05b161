"""The run scripts the course's users launch (run_data_parallel.py, run_pipeline.py, run_tensor_parallel.py) and what they alone need (Modal support, Slurm)."""
