"""GPU leases owned by the lease manager: one lease per group, TTL at least 60 s, the park phase, the GPULease uid"""

from alembic import op
import sqlalchemy as sa

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    # Rows written before the lease manager owned the table: keep the newest lease of each group, and raise a TTL
    # below the minimum to it, so the constraints below hold.
    op.execute(
        "DELETE FROM leases AS older USING leases AS newer WHERE older.group_name = newer.group_name"
        " AND (older.acquired_at, older.name) < (newer.acquired_at, newer.name)"
    )
    op.execute("UPDATE leases SET ttl_seconds = 60 WHERE ttl_seconds < 60")
    op.drop_index("ix_leases_group_name", table_name="leases")
    op.create_index(op.f("ix_leases_group_name"), "leases", ["group_name"], unique=True)
    op.create_check_constraint("ck_leases_ttl_seconds_min", "leases", "ttl_seconds >= 60")
    op.add_column("leases", sa.Column("phase", sa.String(length=16), server_default="Parking", nullable=False))
    op.add_column("leases", sa.Column("message", sa.Text(), server_default="", nullable=False))
    op.add_column("leases", sa.Column("held_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("leases", sa.Column("resource_uid", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("leases", "resource_uid")
    op.drop_column("leases", "held_at")
    op.drop_column("leases", "message")
    op.drop_column("leases", "phase")
    op.drop_constraint("ck_leases_ttl_seconds_min", "leases", type_="check")
    op.drop_index(op.f("ix_leases_group_name"), table_name="leases")
    op.create_index(op.f("ix_leases_group_name"), "leases", ["group_name"], unique=False)
