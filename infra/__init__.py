"""Execution at scale: Ray actor pools for forecasting and GPU measurement, the single-machine executor, service launchers."""
