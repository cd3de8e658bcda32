"""`alembic check` against a throw-away database: fails when the SQLAlchemy models and the migrations differ.

Uses FLEXINFER_TEST_DATABASE_URL when set (a loopback server), else starts an embedded PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from pathlib import Path

from alembic import command

from flexinfer_cli.embedded import EmbeddedPostgres
from flexinfer_common.db import _alembic_config, upgrade_database_sync
from flexinfer_testbed.servers import create_test_database, drop_test_database, normalize_database_url


def main() -> int:
    admin = os.environ.get("FLEXINFER_TEST_DATABASE_URL")
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        if not admin:
            server = EmbeddedPostgres(Path(tmp) / "pg", durable=False)
            admin = server.start()
        admin = normalize_database_url(admin)
        name = f"flexinfer_check_{uuid.uuid4().hex[:8]}"
        try:
            url = asyncio.run(create_test_database(admin, name))
            upgrade_database_sync(url)
            command.check(_alembic_config(url))
            print("migrations match the models")
        finally:
            asyncio.run(drop_test_database(admin, name))
            if server is not None:
                server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
