"""batchers stage of clipstream (see DESIGN.md)."""
