"""What-if autoscaling study: planners driving the fleet simulator, and its report."""
