"""The edge of the HTTP server: what every request meets before and after its route
(admission, the access log, the drain at shutdown, load shedding, the accept loop)."""
