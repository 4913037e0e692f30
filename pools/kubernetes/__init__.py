"""Kubernetes discovery and scaling: pods watched by label selector, Deployments scaled."""
