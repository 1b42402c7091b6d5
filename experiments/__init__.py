"""Scripts that train, evaluate and benchmark; each is runnable as `python -m spantrain.experiments.NAME`."""
