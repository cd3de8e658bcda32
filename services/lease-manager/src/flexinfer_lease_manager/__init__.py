"""FlexInfer lease manager: GPU leases for training jobs (acquire, park, renew, release, expire)."""

__version__ = "0.1.0"
