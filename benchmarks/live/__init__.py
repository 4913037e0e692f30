"""The live load generator behind `pdorch bench live` (OpenAI streaming, real time)."""
