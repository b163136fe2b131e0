"""The upstreams a request is sent to: any OpenAI-compatible server over httpx, and
Anthropic through its SDK."""
