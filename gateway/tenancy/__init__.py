"""Who is calling: tenants, caller identification, and their rate and concurrency limits."""
