"""spec sync from Kubernetes: where a model's or group's manifest comes from, and the generation it reflects"""

from alembic import op
import sqlalchemy as sa

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.add_column("models", sa.Column("source", sa.String(length=32), server_default="api", nullable=False))
    op.add_column("models", sa.Column("source_observed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("models", sa.Column("observed_generation", sa.Integer(), nullable=True))
    op.add_column("groups", sa.Column("source", sa.String(length=32), server_default="api", nullable=False))
    op.add_column("groups", sa.Column("source_observed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("groups", sa.Column("namespace", sa.String(length=253), nullable=True))


def downgrade() -> None:
    op.drop_column("groups", "namespace")
    op.drop_column("groups", "source_observed_at")
    op.drop_column("groups", "source")
    op.drop_column("models", "observed_generation")
    op.drop_column("models", "source_observed_at")
    op.drop_column("models", "source")
