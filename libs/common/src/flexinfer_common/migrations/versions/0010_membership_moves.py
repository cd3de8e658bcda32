"""a loaded model moved to another group by a membership change from Kubernetes (a GPUGroup created, changed or
deleted, or a Model's spec.gpu.shared) stays in its group until it is confirmed parked there (``models.moving_to``:
the group it joins then), so two groups never both schedule it
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_membership_moves"
down_revision = "0009_resident_sets"


def upgrade() -> None:
    op.add_column("models", sa.Column("moving_to", sa.String(length=253), nullable=True))


def downgrade() -> None:
    op.drop_column("models", "moving_to")
