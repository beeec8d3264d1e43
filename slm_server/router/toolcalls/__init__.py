"""The model's tool calls, checked against the tools the request offered and repaired
where nothing is lost (issue 42): the pure core first."""
