"""Shared training code of the course: data, tokenizer, model presets, train/eval loop, launcher, results, plots."""
