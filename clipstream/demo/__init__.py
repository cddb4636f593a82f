"""`make demo`: five digit models behind the whole pipeline, one degraded and recovered mid-run."""
