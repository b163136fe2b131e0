"""HTTP building blocks: server-sent events, reading a client's body, the gateway's
headers, responses and error envelopes."""
