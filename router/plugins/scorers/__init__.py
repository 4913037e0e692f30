"""Scorers: one number per candidate, in the scorer's own direction; weights live in profiles."""
