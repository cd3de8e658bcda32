from __future__ import annotations

from flexinfer_common.settings import CommonSettings


class LeaseManagerSettings(CommonSettings):
    pass
