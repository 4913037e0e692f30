"""The simulated vLLM engine.

A pure engine core (virtual or real time) and its vLLM-compatible server; see README.md.
"""
