"""status page: how often each model's server crashed after it was Ready (status.restarts)"""

from alembic import op
import sqlalchemy as sa

revision = "0005_status_page_restarts"
down_revision = "0005_api_invariants"


def upgrade() -> None:
    op.add_column("models", sa.Column("restarts", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    op.drop_column("models", "restarts")
