"""Structured summaries: the background service and the summary model's client."""
