"""Orchestration over the models: services write, selectors read (STYLE.md)."""
