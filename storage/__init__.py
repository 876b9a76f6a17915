"""Parquet tables under one data-root URI (a local folder or s3://bucket/prefix), and tracking helpers."""
