"""The coordinator app: OpenAI-compatible P/D endpoint over a fleet (issue 6).

- `state.Coordinator`: router state (PdRouter, TokenLoad, KV indexes, KV event subscriber)
  wired to the fleet (health, metrics, membership); token-load delta hooks for several
  coordinators.
- `api.create_app(coordinator)`: the FastAPI app (OpenAI routes, /health, /metrics, /admin).
- `flow.RequestFlow`: one request's P/D flow with its fallbacks; `legs`: the upstream HTTP legs.
- `server.run_coordinator(config)`: engines + coordinator + HTTP server, stopped together.
"""
