"""clipstream's benchmarks: ``make bench`` runs them all (see README.md, Benchmarks)."""
