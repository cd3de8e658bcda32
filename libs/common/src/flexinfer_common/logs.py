"""Structured logging: one JSON object per line on stderr.

Fields passed with ``extra={...}`` land in the line beside ``ts``, ``level``, ``service``, ``logger`` and ``msg``.
The values of secret settings (the admin token, keys, passwords) are registered with :func:`start_logging` and
never written: a line that would contain one carries ``[redacted]`` instead.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


REDACTED = "[redacted]"
_MIN_SECRET_LENGTH = 4  # shorter values would redact ordinary words


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str, secrets: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.service = service
        self.secrets = tuple(s for s in secrets if len(s) >= _MIN_SECRET_LENGTH)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        text = json.dumps(line, default=str)
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text


def configure_logging(service: str, level: str = "INFO", *, secrets: tuple[str, ...] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service, secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("uvicorn.access", "nats", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("uvicorn.error").propagate = True


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)


def start_logging(service: str, settings: Any) -> None:
    """A service's logging from its settings (``CommonSettings``): JSON lines at its level, its secrets redacted,
    and a warning for each way it is exposed beyond what the defaults allow."""
    configure_logging(service, settings.log_level, secrets=tuple(settings.secret_values()))
    for warning in settings.security_warnings():
        logging.getLogger("flexinfer.security").warning(warning)
