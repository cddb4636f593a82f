"""workers stage of clipstream (see DESIGN.md)."""
