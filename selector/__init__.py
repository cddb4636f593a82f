"""selector stage of clipstream (see DESIGN.md)."""
