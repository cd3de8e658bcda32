"""a demand message's own validity: until when a source's queued count stands without a newer message
(``demand_signals.valid_until``, from the message's ``validFor``), so a proxy whose refresh interval is longer than
the scheduler assumes keeps its waiting requests' demand
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_demand_valid_for"
down_revision = "0005_bus_auth"


def upgrade() -> None:
    op.add_column("demand_signals", sa.Column("valid_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("demand_signals", "valid_until")
