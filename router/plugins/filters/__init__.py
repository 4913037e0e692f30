"""Filters: drop candidates that must not get the request, saying why."""
