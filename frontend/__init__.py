"""frontend stage of clipstream (see DESIGN.md)."""
