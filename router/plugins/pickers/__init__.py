"""Pickers: choose one candidate from the scored survivors."""
