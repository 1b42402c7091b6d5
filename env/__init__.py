"""The cost model (pipeline schedules, sync, memory) and the Gymnasium environment."""
