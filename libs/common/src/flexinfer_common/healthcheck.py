"""``python -m flexinfer_common.healthcheck URL``: the images' HEALTHCHECK, one probe for every service.

``URL`` names environment variables as ``${NAME}`` (an exec-form HEALTHCHECK expands none), e.g.
``http://127.0.0.1:${FLEXINFER_PROXY_PORT}/healthz``. The probe passes (exit 0) when the URL answers 2xx within
2 s; an error or a timeout is raised, which exits 1: what Docker counts as unhealthy.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def probe(url: str) -> None:
    with urllib.request.urlopen(os.path.expandvars(url), timeout=2):
        pass


if __name__ == "__main__":  # pragma: no cover - run by Docker
    probe(sys.argv[1])
