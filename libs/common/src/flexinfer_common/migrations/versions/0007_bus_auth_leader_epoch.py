"""the scheduler leader's fencing token: a sequence whose next value each new leader takes when it acquires the
leader lock, carried on every ScaleCommand (``leader_epoch``) so the actuator refuses a deposed leader's commands
"""

from alembic import op

revision = "0005_bus_auth"
down_revision = "0005_status_page_restarts"


def upgrade() -> None:
    op.execute("CREATE SEQUENCE IF NOT EXISTS scheduler_leader_epoch AS bigint START WITH 1 NO CYCLE")


def downgrade() -> None:
    op.execute("DROP SEQUENCE IF EXISTS scheduler_leader_epoch")
