"""selector stage of clipstream: select, combine by the deadline, learn (see docs/design/)."""
