"""Decide and build: rank weight plans, expert tables, Engram assets, and their lowering into images."""
