"""The actuator's pure logic: which commands to apply, what a command means given what runs, how to start a
model's process and how to describe its failure. No I/O here (import-linter forbids it)."""
