"""workers stage of clipstream: one model replica per process (see docs/CONTRACTS.md)."""
