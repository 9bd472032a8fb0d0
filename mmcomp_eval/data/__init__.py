"""Datasets: reading annotation files and building evaluation splits."""
