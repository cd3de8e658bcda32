"""measured GPU memory and discovered capacity (local mode with a GPU): ``models.measured_memory`` holds what a
model's processes held when last measured; ``gpu_inventory`` the devices the local actuator found at its start,
the capacity of a v1alpha2 shared group that declares none
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_measured_memory"
down_revision = "0009_membership_moves"


def upgrade() -> None:
    op.add_column("models", sa.Column("measured_memory", sa.BigInteger(), nullable=True))
    op.create_table(
        "gpu_inventory",
        sa.Column("backend", sa.String(length=32), primary_key=True),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("memory_per_device", sa.BigInteger(), nullable=False),
        sa.Column("actuator", sa.Text(), server_default="", nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gpu_inventory")
    op.drop_column("models", "measured_memory")
