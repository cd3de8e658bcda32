"""The proxy's edges: the routes KV watcher, the demand publisher, and the upstream HTTP client."""
