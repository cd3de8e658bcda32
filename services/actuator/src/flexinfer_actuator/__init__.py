"""FlexInfer actuator: applies the scheduler's scale commands (activate, park) and reports real readiness."""

__version__ = "0.1.0"
