"""The actuator's HTTP surface: ops endpoints and the process table (``GET /api/v1/processes``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from flexinfer_actuator import __version__
from flexinfer_actuator.domain.processes import ProcessInfo, ProcessPhase
from flexinfer_common.service import ReadinessCheck, admin_app, admin_router


class ProcessItem(BaseModel):
    """A model runtime this actuator runs: a local process, or a Pod (alive: Loading, Ready, Stopping or Sleeping)."""

    model_config = ConfigDict(populate_by_name=True)

    namespace: str
    name: str
    pid: int | None = Field(description="The model's process (local back-end); null for a Pod")
    pod: str | None = Field(None, description="The Pod serving the model (kubernetes back-end)")
    port: int
    phase: ProcessPhase
    generation: int = Field(description="The command generation the process answers")
    started_at: datetime = Field(alias="startedAt")
    endpoint: str = Field(examples=["http://127.0.0.1:41234"])

    @classmethod
    def of(cls, info: ProcessInfo) -> ProcessItem:
        return cls.model_validate(info, from_attributes=True)  # the same fields, by name


class ProcessList(BaseModel):
    items: list[ProcessItem]


def build_app(
    *,
    processes: Callable[[], list[ProcessInfo]],
    readiness: ReadinessCheck,
    admin_token: str | None,
) -> FastAPI:
    app = admin_app("FlexInfer actuator", __version__, readiness)
    api = admin_router(admin_token)

    @api.get("/processes", response_model=ProcessList, response_model_by_alias=True)
    async def list_processes() -> ProcessList:
        """The model processes running now, in start order."""
        return ProcessList(items=[ProcessItem.of(info) for info in processes()])

    app.include_router(api)
    return app
