"""scheduling quality: since when a model has wanted the GPU (hysteresis delay, bounded wait) and the requests each
proxy has in flight (the drain)
"""

from alembic import op
import sqlalchemy as sa

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.add_column("models", sa.Column("demand_since", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "in_flight_reports",
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("source", sa.String(length=253), nullable=False),
        sa.Column("count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "name", "source"),
    )


def downgrade() -> None:
    op.drop_table("in_flight_reports")
    op.drop_column("models", "demand_since")
