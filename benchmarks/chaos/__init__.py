"""`pdorch bench chaos`: engine faults under load against a simulated P/D fleet."""
