"""Live autoscaling benchmark: a real fleet beside the what-if (`pdorch bench autoscale --live`)."""
