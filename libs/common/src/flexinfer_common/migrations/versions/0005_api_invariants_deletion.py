"""deleting a model parks it first (models.deleting_at), and command generations that outlive a model's row"""

from alembic import op
import sqlalchemy as sa

revision = "0005_api_invariants"
down_revision = "0004"


def upgrade() -> None:
    op.add_column("models", sa.Column("deleting_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "command_generations",
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("generation", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("namespace", "name"),
    )


def downgrade() -> None:
    op.drop_table("command_generations")
    op.drop_column("models", "deleting_at")
