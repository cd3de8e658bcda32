"""The Kubernetes API as the actuator and the lease manager use it (the ``kubernetes`` extra of flexinfer-common).

``client`` wraps the official ``kubernetes`` client: every call goes through one generic request function (JSON
bodies as dicts, run off the event loop), so the calls the code makes are few and visible. ``informer`` keeps a
watched cache that survives expired watches (410 Gone) and an unreachable API server; ``leader`` elects one active
replica on a ``coordination.k8s.io`` Lease.
"""
