"""Configuration schemas of the coordinator (fleet files, SLO policies)."""
