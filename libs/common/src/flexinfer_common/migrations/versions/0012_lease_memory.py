"""a lease with memory (GPULease spec.memory) frees only that much on one device of a group with a capacity
(``leases.memory``, bytes) and says which device the scheduler reserved (``leases.device``)
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_lease_memory"
down_revision = "0011_measured_memory"


def upgrade() -> None:
    op.add_column("leases", sa.Column("memory", sa.BigInteger(), nullable=True))
    op.add_column("leases", sa.Column("device", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("leases", "device")
    op.drop_column("leases", "memory")
