"""A test bed for FlexInfer that is not a test: real NATS and PostgreSQL for a run (``servers``), the services
started in-process (``system``), and an emulated Kubernetes cluster (``kube``, ``kube_models``). The test-suite,
the benchmarks (bench/) and the tools (scripts/check_migrations.py) use it; it ships in no image."""
