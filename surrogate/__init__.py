"""Forecasting a candidate's speedup and how sure we are of it: bins, forecasters, calibration, policies."""
