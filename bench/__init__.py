"""bench stage of clipstream (see DESIGN.md)."""
