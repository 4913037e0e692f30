"""Shipped routing profiles (`*.yaml`, package data), loaded by name by `router.plugins.spec`."""
