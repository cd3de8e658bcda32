"""several models on one card: where each loaded model of a group with a capacity was placed
(``models.placement``, device indexes "0,1") and since when it is being evicted to make room
(``models.evicting_since``)
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_resident_sets"
down_revision = "0008_demand_valid_for"


def upgrade() -> None:
    op.add_column("models", sa.Column("placement", sa.String(64), nullable=True))
    op.add_column("models", sa.Column("evicting_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("models", "evicting_since")
    op.drop_column("models", "placement")
