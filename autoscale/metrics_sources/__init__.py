"""Metrics sources: the live fleet → one `autoscale.signals.Observation` per control tick.

`base.MetricsSource` is the interface the control loop calls; `histogram` holds the one
percentile-from-cumulative-buckets helper every source shares. Implementations:
`coordinator.CoordinatorSource` (the coordinator's `/metrics` + `/admin/pools`),
`engines.EngineScrapeSource` (every engine's `/metrics`), `prometheus.PrometheusSource`
(PromQL over Prometheus's HTTP API). See autoscale/README.md, "Metrics sources".
"""
