"""The simulated vLLM engine: a pure engine core (virtual or real time) and its vLLM-compatible server."""
