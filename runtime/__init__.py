"""Executing plans with torch.distributed: models, executor, checkpoints, emulated cluster."""
