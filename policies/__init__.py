"""Planners: the heuristic fallback, baselines, exhaustive search and the learned PPO policy."""
