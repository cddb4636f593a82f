"""batchers stage of clipstream: cache, deadline queue, AIMD, dispatch (see docs/design/)."""
