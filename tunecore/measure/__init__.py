"""Measurers: how candidates are built and timed (`local` here; plugins add others)."""
